"""The init container's side of the gpu-check gate: send the pod's projected token, read the verdict, one line.

Standard library only (no Kubernetes client, no GPU library): it runs unprivileged with no GPU and no host path.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from gpuwarden.ops.k8s.gate import PATH


def ask(url: str, token_file: str, timeout_s: float = 10.0) -> tuple[int, str]:
    """(exit code, line): 0 clean, 1 not clean or refused, 2 nothing could be asked (no token, no answer)."""
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        return 2, (f"gpu-check: cannot read the token {token_file}: {exc.strerror} (mount the projected "
                   "service-account token the admission policy adds: volume gpuwarden-token)")
    target = url.rstrip("/") + (PATH if not url.rstrip("/").endswith(PATH) else "")
    request = urllib.request.Request(target, data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            doc = json.loads(resp.read(65536) or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read(65536) or b"{}").get("reason") or exc.reason
        except ValueError:
            reason = exc.reason
        return 1, f"gpu-check: the node's agent refused ({exc.code}): {reason}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        cause = getattr(exc, "reason", exc)
        return 2, (f"gpu-check: no answer from the node's agent at {target}: {cause} (is the gpuwarden agent "
                   "running on this node, with [kubernetes] gate_listen and its hostPort?)")
    gpus = ", ".join(map(str, doc.get("gpus") or [])) or "none"
    if doc.get("ok"):
        return 0, f"gpu-check: pod {doc.get('pod')}: GPU {gpus} clean"
    return 1, f"gpu-check: pod {doc.get('pod')}: not fit for a new tenant: {doc.get('reason')}"
