"""Is a GPU fit for a new tenant? The verdict behind `gpuwarden gpu-check` (an init container's gate).

Which GPUs: those named, else the ones the kubelet gave this pod (when the agent knows), else the ones
this process may see through ROCR/CUDA/HIP_VISIBLE_DEVICES, else every GPU of the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.ops.foundation.errors import NotFound
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.k8s.cgroup import parse as parse_cgroup

VISIBILITY_ORDER = ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@dataclass(frozen=True)
class GpuVerdict:
    gpu: int
    ok: bool
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"gpu": self.gpu, "ok": self.ok, "reasons": list(self.reasons)}


def own_pod_uid(proc_root: Path = Path("/proc")) -> str | None:
    try:
        found = parse_cgroup((proc_root / "self/cgroup").read_text())
    except OSError:
        return None
    return found.pod_uid if found else None


def visible_gpus(snap: NodeSnapshot, env: Mapping[str, str] | None = None) -> tuple[list[int] | None, str]:
    """GPU indexes named by the first visibility variable set (indexes or UUIDs), and which it was."""
    source = os.environ if env is None else env
    for var in VISIBILITY_ORDER:
        value = source.get(var)
        if value is None or value.strip() == "":
            continue
        out = []
        for item in (v.strip() for v in value.split(",")):
            if item.isdigit():
                out.append(int(item))
                continue
            g = next((g for g in snap.gpus if g.uuid and g.uuid.lower() == item.lower()), None)
            if g is None:
                raise NotFound(f"{var}={value}: no GPU {item!r} on this node",
                               "see `gpuwarden status` for the GPUs and their UUIDs")
            out.append(g.index)
        return out, var
    return None, ""


def choose_gpus(snap: NodeSnapshot, named: list[int], *, pod_uid: str | None = None,
                env: Mapping[str, str] | None = None) -> tuple[list[int], str]:
    """(GPU indexes to check, where they came from)."""
    if named:
        return named, "named"
    if pod_uid:
        mine = sorted({g for p in snap.pods if p.pod_uid == pod_uid and p.deleted_at is None for g in p.gpus})
        if mine:
            return mine, "assigned to this pod by the kubelet"
    vis, var = visible_gpus(snap, env)
    if vis is not None:
        return vis, var
    return [g.index for g in snap.gpus], "every GPU of the node"


def check(snap: NodeSnapshot, gpus: list[int], reset_needed: frozenset[int] = frozenset()) -> list[GpuVerdict]:
    out = []
    residual = {r.gpu_index: r for r in snap.residual}
    for index in gpus:
        if snap.gpu(index) is None:
            have = ", ".join(str(g.index) for g in snap.gpus) or "none"
            raise NotFound(f"no GPU {index} on this node (GPUs: {have})", "see `gpuwarden status` for the GPU indexes")
        reasons = []
        r = residual.get(index)
        if r is not None and r.significant:
            reasons.append(f"{fmt_bytes(r.residual)} of residual VRAM held by no live process")
        for h in (r.holders if r else ()):
            who = f"pid {h.pid}" if h.pid is not None else "no process"
            pod = f" of pod {h.namespace}/{h.pod}" if h.pod else ""
            reasons.append(f"{who}{pod} holds it ({h.reason})")
        if index in snap.drained:
            reasons.append("drained (an operator took it out of service)")
        if index in reset_needed:
            reasons.append("its last reset failed: it needs a reset")
        out.append(GpuVerdict(index, not reasons, tuple(reasons)))
    return out
