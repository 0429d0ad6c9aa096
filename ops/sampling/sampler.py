"""The Sampler: one NodeSnapshot per call, from attribution (every refresh) and the node extras.

Status, the TUI, the agent and the exporter all sample through it; take_snapshot is the one-shot form.
"""

from __future__ import annotations

import os
import time

from gpuwarden.ops.node.backends.select import open_backend
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.fdbudget import OutOfDescriptors
from gpuwarden.ops.foundation.model import NodeSnapshot, Residual, SnapshotWarning, Holder
from gpuwarden.ops.foundation.records import replace
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.sampling.attribution import Attribution
from gpuwarden.ops.sampling.extras import NodeExtras
from gpuwarden.ops.node.debugfs.reader import DebugfsReader

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.ops.node.backends.base import Backend
    from gpuwarden.ops.foundation.deadline import LateRead
    from gpuwarden.ops.node.debugfs.books import Books
    from gpuwarden.ops.foundation.model import GpuInfo, GpuProcess
    from gpuwarden.ops.foundation.pidwatch import PidWatch


class Sampler:
    """Takes snapshots of one node. Not thread-safe: one sampler per worker."""

    def __init__(self, settings: Settings, backend: Backend | None = None, *, deep_every_s: float = 10.0,
                 use_pidfds: bool = True, full_scan_every_s: float = 0.0, process_load: bool = True):
        self.settings = settings
        self.backend = backend or open_backend(settings)
        self.deep_every_s = deep_every_s
        # Deep scans in between look only at new processes and known holders (the agent: 5 min; 0: always full).
        self.full_scan_every_s = full_scan_every_s
        self.attribution = Attribution(settings, self.backend, use_pidfds=use_pidfds)
        self.extras = NodeExtras(settings)
        # Host CPU/RSS and GPU time per process (None: left out, e.g. to measure what it costs).
        self.load = None
        if process_load:
            # deferred: keeps the agent's start cheap (0.7 ms there)
            from gpuwarden.ops.sampling.procload import ProcLoadReader
            self.load = ProcLoadReader(settings.proc_root, getattr(self.backend, "fdinfo_root", None),
                                       deadline_s=settings.read_timeout_s,
                                       before_read=getattr(self.backend, "fdinfo_refresh", None))
        self._hostname = os.uname().nodename  # what socket.gethostname() returns, without importing socket
        self._debugfs: DebugfsReader | None = None  # the allow-listed debugfs reader, made at the first AMD refresh
        self._books: Books | None = None  # the driver's books read through it, refresh after refresh
        self._kfd_computed: tuple[dict[str, object] | None] | None = None  # KFD's limit from RAM, once read
        # Whether anyone shows per-process GPU%: NVML's per-process utilisation is the costliest call of a refresh
        # with a busy process, and a console whose Processes view is hidden need not ask it (issue 38).
        self.process_gpu = True

    def quiet_process_gpu(self, quiet: bool) -> None:
        """Nobody reads per-process GPU% now (an agent with no client): a backend whose per-process call is dear
        asks it seldom (NVML: every UTIL_QUIET_EVERY_S), not at its usual cadence."""
        if hasattr(self.backend, "util_quiet"):
            self.backend.util_quiet = quiet

    @property
    def _watch(self) -> PidWatch | None:  # the pidfd watch, for tests that check what is tracked
        return self.attribution.watch

    def close(self) -> None:
        self.close_readers()
        self.backend.close()

    def close_readers(self) -> None:
        """Close what the sampler itself holds open (pidfds, stat files), leaving the backend open."""
        self.attribution.close()
        self.extras.close()
        if self.load is not None:
            self.load.close()

    def deep_scan(self) -> None:
        self.attribution.deep_scan()

    def snapshot(self, deep: bool | None = None) -> NodeSnapshot:
        t0 = time.perf_counter()
        attribution = self.attribution
        now = time.monotonic()
        if deep:
            attribution.deep_scan()
        elif deep is None and now - attribution.last_deep >= self.deep_every_s:
            attribution.deep_scan(full=now - attribution.last_full >= self.full_scan_every_s)
        try:
            gpus, processes = attribution.sample()
        except OutOfDescriptors as exc:
            raise GpuwardenError(f"out of file descriptors while sampling ({exc.strerror})",
                                 "raise the open-files limit (ulimit -n, LimitNOFILE=) for gpuwarden") from None
        loads = {}
        if self.load is not None and not self.settings.replay:
            utilisation = getattr(self.backend, "process_utilisation", None)
            loads = self.load.sample(processes, gpus, attribution.drm_fds,
                                     utilisation() if utilisation is not None and self.process_gpu else None)
        extras = self.extras.sample()
        residual, residual_warnings = attribution.residual(gpus, processes, extras.baseline)
        late = getattr(self.backend, "late", ())  # late reads of the refresh that belong to no one GPU
        if late:
            residual, residual_warnings = _unknown_residual(residual, late), []
        warnings: list[SnapshotWarning] = []
        if self.backend.simulated:
            why = getattr(self.backend, "fallback_reason", None)
            warnings.append(SnapshotWarning("simulated", f"SIMULATED node: no real GPU backend works here ({why})"
                                            if why else "SIMULATED node (--backend sim)"))
        # A GPU that did not answer in time, and a late per-process file: named, with the file (a stable text, so
        # a viewer's event log says it once, not every refresh).
        warnings.extend(SnapshotWarning("stale", g.stale.message, g.index) for g in gpus if g.stale is not None)
        warnings.extend(SnapshotWarning("stale", f"{r.message}; per-process VRAM is from the last complete read and "
                                        "residual VRAM is unknown", r.gpu) for r in late)
        warnings.extend(residual_warnings)
        late_load = self.load.late if self.load is not None else None
        if late_load is not None:
            warnings.append(SnapshotWarning("stale", f"{late_load.message}; per-process GPU% is from the last complete "
                                            "read", late_load.gpu))
        if not extras.baseline and not extras.baseline_problem:
            warnings.append(SnapshotWarning(
                "no-baseline", "no idle baseline recorded: residual counts all unexplained VRAM "
                "(record one with `gpuwarden baseline record` on an idle node)"))
        if attribution.nested_ns:
            warnings.append(SnapshotWarning(
                "pid-namespace", "running inside a PID namespace: the driver reports host PIDs, so process "
                "details may be missing; run gpuwarden on the host (or with the host's PID namespace)"))
        warnings.extend(extras.warnings)
        driver = self._driver_books(gpus)
        if driver is not None and any(r.significant and not r.holders for r in residual):
            residual, warnings = self._gem_holders(residual, processes, warnings)
        return NodeSnapshot(
            taken_at=time.time(), hostname=self._hostname, backend=self.backend.name,
            simulated=self.backend.simulated, gpus=gpus, processes=processes, residual=residual,
            engines=extras.engines, arenas=extras.arenas, drained=extras.drained, warnings=tuple(warnings),
            baseline_recorded=bool(extras.baseline),
            source=f"bundle:{self.settings.replay}" if self.settings.replay else "live",
            duration_s=round(time.perf_counter() - t0, 6), driver=driver, process_load=loads,
            process_vram_checked_at=getattr(self.backend, "vram_checked_at", None),
        )

    def _gem_holders(self, residual: tuple[Residual, ...], processes: tuple[GpuProcess, ...],
                     warnings: list[SnapshotWarning]) -> tuple[tuple[Residual, ...], list[SnapshotWarning]]:
        """Residual VRAM no live process and no holder explains: amdgpu_gem_info's per-client buffer lists name
        who holds buffers there (a DRM client KFD has no per-process entry for). Read only for such a GPU."""
        # only the AMD backends read debugfs: status on an NVIDIA node goes without it
        # deferred: keeps the agent's start cheap (1.6 ms there)
        from gpuwarden.ops.node.debugfs import books
        reader = self._debugfs
        if reader is None:
            return residual, warnings  # no books read this refresh: nothing to look in
        out, named = [], set()
        for r in residual:
            if not (r.significant and not r.holders):
                out.append(r)
                continue
            by_pid, _why = books.holders(reader, r.gpu_index)
            accounted = {p.pid for p in processes if p.vram.get(r.gpu_index)}
            found = tuple(Holder(pid=h["pid"], start_time=None, reason="gem-buffers", gpus=(r.gpu_index,),
                                 vram_bytes=h["vram_bytes"], command=h["command"],
                                 detail=f"amdgpu_gem_info: {h['objects']} buffer(s) in {h['clients']} DRM client(s); "
                                        "KFD has no entry for it")
                          for h in sorted(by_pid.values(), key=lambda h: -h["vram_bytes"])
                          if h["vram_bytes"] and h["pid"] not in accounted)
            if found:
                named.add(r.gpu_index)
            out.append(Residual(gpu_index=r.gpu_index, device_used=r.device_used, accounted=r.accounted,
                                baseline=r.baseline, residual=r.residual, holders=found, significant=r.significant))
        warnings = [w for w in warnings if not (w.code == "ownerless-leak" and w.gpu in named)]
        return tuple(out), warnings

    def _driver_books(self, gpus: tuple[GpuInfo, ...]) -> dict[str, Any] | None:
        """KFD system memory and VRAM free space from debugfs, for AMD backends on a live node (root only)."""
        if self.settings.replay or self.backend.name not in ("sysfs", "amdsmi", "sim") or not gpus:
            return None
        if self._debugfs is None:
            # the backend's own tree: the sim node's root, a --sysfs-root, or /sys (debugfs is <sys>/kernel/debug)
            sysfs = getattr(self.backend, "sysfs_root", None) or self.settings.sysfs_root
            self._debugfs = DebugfsReader(sysfs / "kernel" / "debug")
        kept = self._books
        if kept is None or kept.reader is not self._debugfs:
            # only the AMD backends read debugfs: status on an NVIDIA node goes without it
            # deferred: keeps the agent's start cheap (1.6 ms there)
            from gpuwarden.ops.node.debugfs.books import Books
            kept = self._books = Books(self._debugfs)
        books = kept.read([g.index for g in gpus])
        if books.get("kfd_mem_limit") is None:
            # Not readable (not root, no debugfs): the limit as amdgpu computes it, said to be computed. RAM is read
            # once per sampler: it does not change under a running driver (the limit is fixed at its load).
            if self._kfd_computed is None:
                # deferred: keeps `gpuwarden status --json` cheap (0.1 ms there); a non-root AMD node reads it
                from gpuwarden.ops.node.debugfs.kfd_limit import computed
                self._kfd_computed = (computed(self.settings.proc_root),)
            books["kfd_mem_limit_computed"] = self._kfd_computed[0]
        return books


def _unknown_residual(residual: tuple[Residual, ...], late: tuple[LateRead, ...]) -> tuple[Residual, ...]:
    """Residual VRAM when the per-process files did not all answer: unknown, never a guess that blames someone."""
    return tuple(replace(r, residual=None, significant=False, holders=()) for r in residual)


def take_snapshot(settings: Settings, backend: Backend | None = None, *, deep: bool = True) -> NodeSnapshot:
    """One full snapshot (with a deep scan for device-file holders), for one-shot commands."""
    # One refresh has no next one for pidfds to save work at: opening them would only add cost.
    sampler = Sampler(settings, backend, use_pidfds=False)
    try:
        return sampler.snapshot(deep=deep)
    finally:
        if backend is None:
            sampler.close()
        else:
            sampler.close_readers()  # the caller's backend stays open for its next use
