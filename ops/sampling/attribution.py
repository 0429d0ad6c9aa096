"""GPU/process attribution, the cheap part of every refresh: GPUs, who uses them, and residual VRAM with holders.

Attribution keeps what makes a 1 Hz refresh cheap (process facts per identity, a pidfd per GPU process,
the device-file holders from the last deep scan), so a refresh reads only what can have changed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuwarden.ops.foundation.heldfiles import HeldFiles
from gpuwarden.ops.foundation.model import GpuInfo, GpuProcess, Holder, ProcessUsage, Residual, SnapshotWarning
from gpuwarden.ops.foundation.pidwatch import PidWatch, usable as pidfds_usable
from gpuwarden.ops.node.procs import ProcInfo, ProcReader
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from gpuwarden.ops.node.backends.base import Backend

    # What a GpuProcess was built from: its facts, the device files it holds, its usage records.
    MadeOf = tuple[ProcInfo | None, tuple[str, ...], list[ProcessUsage] | None]
    # residual()'s pass: VRAM accounted per GPU, GPUs with an unknown share, holders per GPU, holders of no one GPU
    PerGpu = tuple[dict[int, int], set[int], dict[int, list[Holder]], tuple[Holder, ...]]

# Below these, unexplained VRAM is driver noise, not a tenant's leftovers.
TOLERANCE_WITH_BASELINE = 256 << 20
TOLERANCE_NO_BASELINE = 512 << 20
TOLERANCE_FRACTION = 0.01

NOT_LIVE = ("zombie", "dead", "gone")
# Processes whose VRAM counts as residual (with a holder) rather than as accounted for.
NOT_ACCOUNTED = frozenset(NOT_LIVE + ("disk-sleep",))

_HOLDER_DETAIL = {
    "kfd-without-process": "the driver still charges VRAM to a PID that no longer exists",
    "unknown-pid": "PID not visible from this PID namespace",
    "disk-sleep": "in uninterruptible sleep: cannot be killed until its I/O returns",
}


def in_nested_pid_namespace(proc_root: Path) -> bool:
    """True when /proc shows a PID namespace below the host's: KFD/NVML PIDs then don't match ours."""
    try:
        for line in (proc_root / "self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) > 2
    except OSError:
        pass
    return False


class Attribution:
    """One node's GPUs and GPU processes, refresh after refresh. Not thread-safe: one per sampler."""

    def __init__(self, settings: Settings, backend: Backend, *, use_pidfds: bool = True):
        self.settings = settings
        self.backend = backend
        self.last_deep = float("-inf")
        # (pid, start ticks) -> device files, for processes seen holding GPU device files
        self._holders: dict[tuple[int, int], tuple[str, ...]] = {}
        # (pid, start ticks) -> {fd: render node} of the holders: what DRM fdinfo is read through (ops/sampling/procload)
        self.drm_fds: dict[tuple[int, int], dict[int, str]] = {}
        self._visibility: dict[tuple[int, int], dict[str, str]] = {}
        self.nested_ns = in_nested_pid_namespace(settings.proc_root)
        # With pidfds, a GPU process's stat is re-read only when it exits, when it is new, while it is in
        # disk sleep, and at the deep-scan cadence. Other state changes (running <-> sleeping, stopped,
        # and entering disk sleep, which only stat shows) are therefore seen at the deep-scan cadence.
        # Without them, every refresh reads every stat. Either way stat files are kept open (one pread at
        # offset 0 each, within the fd budget): after each deep scan all 2,000 of a big node are re-read, and
        # open+close were 11 of those 37 ms (issue 38). A kept fd is bound to its process: once that one is
        # reaped the read fails (ESRCH), the fd is dropped and the PID's new owner opened afresh (ProcReader.read).
        self.watch = PidWatch() if use_pidfds and not self.nested_ns and pidfds_usable(settings.proc_root) else None
        self.procs = ProcReader(settings.proc_root, held=HeldFiles())
        self._known: dict[int, ProcInfo] = {}  # pid -> facts read while its pidfd was watched
        self._sleeping: set[int] = set()  # the PIDs of _known in disk sleep (kept with it: no scan of 2,000)
        self._reread_all = True
        # pid -> (what it was built from, the GpuProcess): reused while nothing it shows changed
        self._built: dict[int, tuple[MadeOf, GpuProcess]] = {}
        # The last refresh's backend answer and result: when the backend hands back the very same objects and no
        # watched process exited, nothing a refresh would compute can differ.
        self._last: tuple[list[ProcessUsage], tuple[GpuProcess, ...]] | None = None
        self._scanned: set[int] = set()  # PIDs whose fds the last deep scans looked at
        # residual()'s pass over the processes, kept while the processes tuple is the very same (see sample)
        self._by_gpu: tuple[tuple[GpuProcess, ...], dict[str, int], PerGpu] | None = None
        self.last_full = float("-inf")

    def close(self) -> None:
        """Close what attribution itself holds open (pidfds, stat files); the backend stays open."""
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        self.procs.close()

    # ------------------------------------------------------------------------------------------
    def deep_scan(self, full: bool = True) -> None:
        """Find every process holding a GPU device file (reads every /proc/<pid>/fd: seconds apart).

        Not full: only processes that started since the last scan, and the holders already known, are looked
        at; a process that opens a GPU device late is found at the next full scan (KFD and NVML list any
        process that allocates GPU memory at once, so what waits is a holder without VRAM)."""
        globs = self.backend.device_globs()
        found: dict[tuple[int, int], tuple[str, ...]] = {}
        drm: dict[tuple[int, int], dict[int, str]] = {}
        live = set()
        me = os.getpid() if self.settings.live else None
        known_holders = {pid for pid, _ in self._holders}
        for pid in self.procs.pids():
            live.add(pid)
            if pid == me or (not full and pid in self._scanned and pid not in known_holders):
                continue  # NVML (and amdsmi) open device files in gpuwarden itself: not a GPU user
            fds: dict[int, str] = {}
            files = self.procs.open_files(pid, globs, fds)
            if not files:
                continue
            info = self.procs.read(pid)
            if info is not None:
                found[(pid, info.start_ticks)] = files
                render = {fd: t for fd, t in fds.items() if "/dri/" in t}
                if render:
                    drm[(pid, info.start_ticks)] = render
        self._holders = found
        self.drm_fds = drm  # a partial scan looks at every known holder again, so this is all of them
        self._scanned = live
        self.procs.forget_dead(live)
        self._visibility = {k: v for k, v in self._visibility.items() if k[0] in live}
        self.last_deep = time.monotonic()
        if full:
            self.last_full = self.last_deep
        self._reread_all = True

    def sample(self) -> tuple[tuple[GpuInfo, ...], tuple[GpuProcess, ...]]:
        """The GPUs and the processes that use them, now."""
        gpus = tuple(self.backend.gpus())
        usage = self.backend.process_usage()
        last = self._last
        if last is not None and self._unchanged(usage, last[0]):
            # The new list of the same objects is what the next refresh is compared with: `usage is before` again.
            self._last = (usage, last[1])
            return gpus, last[1]
        processes = self._attribute(usage)
        self._last = (usage, processes) if self.watch is not None else None
        return gpus, processes

    def _unchanged(self, usage: list[ProcessUsage], before: list[ProcessUsage]) -> bool:
        """True when a refresh can only repeat the last one: same usage objects, nothing exited or re-read."""
        if self._reread_all or len(usage) != len(before) or self.watch is None or self.watch.exited():
            return False
        if self._sleeping:
            return False  # one in disk sleep is re-read every refresh until it wakes
        return usage is before or all(a is b for a, b in zip(usage, before))

    def _attribute(self, usage: list[ProcessUsage]) -> tuple[GpuProcess, ...]:
        by_pid: dict[int, list[ProcessUsage]] = {}
        for u in usage:
            lst = by_pid.get(u.pid)
            if lst is None:
                by_pid[u.pid] = [u]
            else:
                lst.append(u)
        holders = self._holders
        holder_files = {pid: files for (pid, _), files in holders.items()}
        pids = sorted(by_pid.keys() | holder_files.keys()) if holder_files else sorted(by_pid)
        infos = self._infos(pids)
        built = self._built
        fresh: dict[int, tuple[MadeOf, GpuProcess]] = {}
        out = []
        for pid in pids:
            info = infos[pid]
            usages = by_pid.get(pid)
            if info is None and usages is None:
                continue  # a device holder that exited cleanly: nothing left behind
            files = holders.get((pid, info.start_ticks), ()) if info is not None and holder_files else ()
            # ProcInfo and ProcessUsage objects are reused by their readers while unchanged, so this
            # comparison is mostly identity checks.
            made_of = (info, files, usages)
            prev = built.get(pid)
            if prev is not None and prev[0] == made_of:
                gp = prev[1]
            else:
                gp = self._build(pid, info, usages or (), files)
            fresh[pid] = (made_of, gp)
            out.append(gp)
        self._built = fresh
        return tuple(out)

    def _build(self, pid: int, info: ProcInfo | None, usages: list[ProcessUsage] | tuple[()],
               files: tuple[str, ...]) -> GpuProcess:
        vram: dict[int, int] = {}
        sources: dict[int, str] = {}
        for u in usages:
            vram[u.gpu_index] = vram.get(u.gpu_index, 0) + u.vram_bytes
            sources[u.gpu_index] = u.source
        if info is None:
            return GpuProcess(pid=pid, start_time=None, user=None, command="", state="gone",
                              vram=vram, sources=sources, device_files=files)
        return GpuProcess(
            pid=pid, start_time=info.start_time, user=info.user, command=info.command, state=info.state,
            ppid=info.ppid, cgroup=info.cgroup, container=info.container, vram=vram, sources=sources,
            device_files=files, visible_devices=self._visible(info))

    def _infos(self, pids: list[int]) -> dict[int, ProcInfo | None]:
        """Each PID's facts now: read from stat where they may have changed, else the ones read before."""
        read = self.procs.read
        watch = self.watch
        if watch is None:
            return {pid: read(pid) for pid in pids}
        known = self._known
        reread_all, self._reread_all = self._reread_all, False
        exited = watch.exited()
        sleeping = self._sleeping
        out: dict[int, ProcInfo | None] = {}
        for pid in pids:
            info = known.get(pid)
            # Disk sleep is often brief (exec, page faults): one seen is re-read until it ends, or a
            # passing moment would count the process as a residual holder until the next deep scan.
            if info is not None and pid not in exited and not reread_all and info.state != "disk-sleep":
                out[pid] = info
                continue
            if pid not in watch:
                watch.track(pid)  # first, so an exit after the read below still shows next time
                info = read(pid)
            else:
                info = read(pid)
                if pid in exited and info is not None and info.state not in ("zombie", "dead"):
                    # The watched process is gone and this PID names a newer one: watch that one instead.
                    watch.forget(pid)
                    watch.track(pid)
                    info = read(pid)
            if info is not None and pid in watch:
                known[pid] = info
                if info.state == "disk-sleep":
                    sleeping.add(pid)
                else:
                    sleeping.discard(pid)
            else:
                known.pop(pid, None)
                sleeping.discard(pid)
                watch.forget(pid)
            out[pid] = info
        for pid in watch.pids() - out.keys():  # no longer a GPU process: stop watching it
            watch.forget(pid)
            known.pop(pid, None)
            sleeping.discard(pid)
        return out

    def _visible(self, info: ProcInfo) -> dict[str, str]:
        key = (info.pid, info.start_ticks)
        if key not in self._visibility:
            self._visibility[key] = self.procs.visibility(info.pid)
        return self._visibility[key]

    # ------------------------------------------------------------------------------------------
    def residual(self, gpus: tuple[GpuInfo, ...], processes: tuple[GpuProcess, ...],
                 baseline: dict[int, int]) -> tuple[tuple[Residual, ...], list[SnapshotWarning]]:
        """Per GPU: device used - what live processes account for - the idle baseline, with its holders."""
        warnings: list[SnapshotWarning] = []
        render_to_gpu = {f: g.index for g in gpus for f in g.device_files}
        last = self._by_gpu
        if last is not None and last[0] is processes and last[1] == render_to_gpu:
            by_gpu = last[2]
        else:
            by_gpu = self._per_gpu(processes, render_to_gpu)
            self._by_gpu = (processes, render_to_gpu, by_gpu)
        accounted_by_gpu, unknown_by_gpu, holders_by_gpu, shared_holders = by_gpu
        out = []
        for g in gpus:
            accounted = accounted_by_gpu.get(g.index, 0)
            base = baseline.get(g.index)
            res = None
            if g.index in unknown_by_gpu:
                # Without every process's share the difference would blame the wrong thing.
                warnings.append(SnapshotWarning(
                    "residual-unknown", f"GPU {g.index}: the driver did not say how much VRAM some processes use "
                    "(run as root to see it): residual unknown", g.index))
            elif g.vram_used is not None:
                res = g.vram_used - accounted - (base or 0)
            tol = TOLERANCE_WITH_BASELINE if base is not None else TOLERANCE_NO_BASELINE
            tol = max(tol, int((g.vram_total or 0) * TOLERANCE_FRACTION))
            holders = tuple(holders_by_gpu.get(g.index, [])) + tuple(shared_holders)
            significant = res is not None and res > tol
            if significant and not holders:
                warnings.append(SnapshotWarning(
                    "ownerless-leak", f"GPU {g.index}: {fmt_bytes(res)} of VRAM held by no live process and no "
                    "holder found: an ownerless leak that only a GPU reset clears", g.index))
            out.append(Residual(gpu_index=g.index, device_used=g.vram_used, accounted=accounted, baseline=base,
                                residual=res, holders=holders, significant=significant))
        return tuple(out), warnings

    def _per_gpu(self, processes: tuple[GpuProcess, ...], render_to_gpu: dict[str, int]) -> PerGpu:
        """(VRAM live processes account for, GPUs where some share is unknown, holders, holders of no one GPU)."""
        holders_by_gpu: dict[int, list[Holder]] = {}
        shared_holders: list[Holder] = []
        accounted_by_gpu: dict[int, int] = {}
        unknown_by_gpu: set[int] = set()
        for p in processes:
            state = p.state
            if state not in NOT_ACCOUNTED:
                # A live process's VRAM is explained: it can free it by itself.
                sources = p.sources
                for gi, b in p.vram.items():
                    accounted_by_gpu[gi] = accounted_by_gpu.get(gi, 0) + b
                    if sources.get(gi) == "nvml-unknown":
                        unknown_by_gpu.add(gi)
                continue
            if state == "gone":
                reason = "unknown-pid" if self.nested_ns else "kfd-without-process"
            elif state == "disk-sleep":
                reason = "disk-sleep"
            else:
                reason = "zombie"
            gpu_set = set(p.vram) | {render_to_gpu[f] for f in p.device_files if f in render_to_gpu}
            detail = _HOLDER_DETAIL.get(reason) or f"exited but not reaped by its parent (pid {p.ppid})"
            holder = Holder(pid=p.pid, start_time=p.start_time, reason=reason, gpus=tuple(sorted(gpu_set)),
                            vram_bytes=sum(p.vram.values()) if p.vram else None, command=p.command or None,
                            ppid=p.ppid, detail=detail)
            if gpu_set:
                for g in gpu_set:
                    holders_by_gpu.setdefault(g, []).append(holder)
            else:
                shared_holders.append(holder)  # holds only /dev/kfd: could be any GPU
        return accounted_by_gpu, unknown_by_gpu, holders_by_gpu, tuple(shared_holders)
