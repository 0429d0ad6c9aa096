"""Choosing a GPU backend, one rule for every command: forced by --backend, else the first real one that opens
(amdsmi, sysfs, nvml). The simulated node only when asked for; when none works the error names each reason.
The one exception is the console a person opens (`open_for_console`): it shows the simulated node, labelled
SIMULATED with the reasons, so `gpuwarden` on a machine without a GPU is a demo, not an error.

Why no automatic fallback to `sim`: a node whose driver failed would be shown, fixed, exported and reported to
Kubernetes as a fake node (commit 6b28e99 refused it for the Kubernetes agent; issue 36 asked for one rule).
"""

from __future__ import annotations

import importlib

from gpuwarden.ops.foundation.errors import BackendUnavailable, GpuwardenError
from gpuwarden.ops.foundation.paths import BACKENDS
from gpuwarden.ops.foundation.settings import Settings

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from gpuwarden.ops.node.backends.base import Backend

# name -> (module, class)
_IMPLS = {
    "amdsmi": ("gpuwarden.ops.node.backends.amdsmi_backend", "AmdSmiBackend"),
    "sysfs": ("gpuwarden.ops.node.backends.sysfs", "SysfsBackend"),
    "nvml": ("gpuwarden.ops.node.backends.nvml", "NvmlBackend"),
    "sim": ("gpuwarden.ops.node.backends.sim", "SimBackend"),
}


def _construct(name: str, settings: Settings, **kw: object) -> Backend:
    module_name, cls_name = _IMPLS[name]
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable(f"{name}: not available in this build ({exc})") from None
    backend: Backend = cls(settings, **kw)
    return backend


def open_backend(settings: Settings) -> Backend:
    """The backend to use. Forced: that one or an error with a hint. Auto: the first real one that opens, or
    BackendUnavailable naming why each failed (never the simulated node: see the module's docstring)."""
    if settings.backend:
        if settings.backend not in BACKENDS:
            raise GpuwardenError(f"unknown backend {settings.backend!r}", f"choose one of: {', '.join(BACKENDS)}")
        try:
            kw = {"create": True} if settings.backend == "sim" else {}
            return _construct(settings.backend, settings, **kw)
        except BackendUnavailable as exc:
            raise BackendUnavailable(
                f"backend {settings.backend} cannot run here: {exc.message}",
                exc.hint or "leave out --backend/GPUWARDEN_BACKEND to pick one automatically") from None

    captured = settings.captured
    order = ["sysfs"] if captured else ["amdsmi", "sysfs", "nvml"]
    reasons = []
    for name in order:
        try:
            return _construct(name, settings)
        except BackendUnavailable as exc:
            reasons.append(exc.message)
    if not captured:
        # deferred: keeps `gpuwarden status --json` cheap (7.8 ms there); the PCI scan runs only when no backend opens
        from gpuwarden.ops.node.backends.pci import describe
        reasons.insert(0, describe(settings.sysfs_root))  # "2 AMD GPUs on the PCI bus, amdgpu not loaded"
    raise BackendUnavailable("no GPU backend works here: " + "; ".join(reasons),
                             "load the GPU driver (or install its library); `gpuwarden --backend sim ...` "
                             "(or GPUWARDEN_BACKEND=sim) shows the simulated node, a demo")


def open_for_console(settings: Settings) -> Backend:
    """The console's backend: open_backend's, else (nothing forced, a live node) the simulated node, labelled with
    why no real backend works (the snapshot's SIMULATED warning carries the reasons)."""
    try:
        return open_backend(settings)
    except BackendUnavailable as exc:
        if settings.backend or settings.captured:
            raise
        return _construct("sim", settings, create=True, fallback_reason=exc.message)
