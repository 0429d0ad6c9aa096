"""Entry points: diagnose the live node (or the trees the settings point at), or a node as a bundle captured it.

Both run the same checks; a bundle is extracted to a temporary directory whose tree/ becomes every root.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.doctor.checks import REGISTRY
from gpuwarden.ops.doctor.probe import Probe, Roots
from gpuwarden.ops.doctor.runner import Progress, Report, run_checks, select
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.bundle.replay import extract, open_bundle


def diagnose(settings: Settings, *, only: list[str] | None = None, timeout_s: float | None = None,
             progress: Progress | None = None, extra: dict[str, Any] | None = None) -> Report:
    checks = select(list(REGISTRY), only)
    probe = Probe(settings, extra=extra)
    source = "live" if probe.live else "tree"
    return run_checks(checks, probe, timeout_s=timeout_s, progress=progress, source=source)


def diagnose_bundle(path: Path | str, settings: Settings, *, only: list[str] | None = None,
                    timeout_s: float | None = None, progress: Progress | None = None) -> Report:
    checks = select(list(REGISTRY), only)  # a wrong name fails before the bundle is unpacked
    path = Path(path)
    with open_bundle(path) as tar, tempfile.TemporaryDirectory(prefix="gpuwarden-doctor-") as tmp:
        base = extract(tar, Path(tmp))
        tree = base / "tree"
        manifest = _json(base / "manifest.json") or {}
        node = _json(base / "node" / "node.json") or {}
        s = settings.with_(sysfs_root=tree / "sys", proc_root=tree / "proc", etc_root=tree / "etc",
                           boot_root=tree / "boot", opt_root=tree / "opt", state_dir=base,
                           config_path=base / "gpuwarden" / "node.toml", backend="sysfs", replay=str(path))
        roots = Roots(sys=s.sysfs_root, gpu=s.sysfs_root, proc=s.proc_root, etc=s.etc_root, boot=s.boot_root,
                      opt=s.opt_root, simulated=bool((manifest.get("tree") or {}).get("simulated")))
        memlock = (node.get("memlock_limit_of_collector") or {}).get("soft")
        extra: dict[str, Any] = {"memlock_soft": memlock, "uid": (node.get("collected_by") or {}).get("uid")}
        smi = base / "vendor" / "nvidia-smi-q.xml"
        if smi.is_file() and smi.stat().st_size:
            extra["nvidia_smi_xml"] = str(smi)
        report = run_checks(checks, Probe(s, roots, live=False, extra=extra), timeout_s=timeout_s,
                            progress=progress, source=f"bundle:{path}")
        report.roots = {k: v.replace(str(base), str(path)) for k, v in report.roots.items()}
        return report


def document(report: Report) -> dict[str, Any]:
    """The `gpuwarden.doctor/1` document `doctor --json` prints."""
    return jsondoc.document("doctor", {
        "source": report.source,
        "simulated": report.simulated,
        "started_at": report.started_at,
        "started_at_iso": jsondoc.iso(report.started_at),
        "duration_s": round(report.duration_s, 4),
        "exit_code": report.exit_code,
        "summary": report.counts(),
        "roots": report.roots,
        "checks": [f.to_dict() for f in report.findings],
    })


def _json(path: Path) -> Any:
    try:
        return jsondoc.loads(path.read_bytes())  # a bundle's: nesting bounded
    except (OSError, ValueError):
        return None
