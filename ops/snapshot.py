"""One NodeSnapshot: GPUs from the backend, processes attributed to them, residual VRAM and holders.

Sampler keeps caches between refreshes (process facts per identity, a pidfd per GPU process, the
device-file holders from the last deep scan) so a 1 Hz refresh reads only what can have changed.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from . import nodestate
from .backends.base import Backend
from .backends.select import open_backend
from .errors import GpuwardenError
from .model import GpuInfo, GpuProcess, Holder, NodeSnapshot, ProcessUsage, Residual
from .heldfiles import HeldFiles
from .pidwatch import PidWatch, usable as pidfds_usable
from .procs import ProcInfo, ProcReader
from .settings import Settings
from .units import fmt_bytes

# Below these, unexplained VRAM is driver noise, not a tenant's leftovers.
TOLERANCE_WITH_BASELINE = 256 << 20
TOLERANCE_NO_BASELINE = 512 << 20
TOLERANCE_FRACTION = 0.01

NOT_LIVE = ("zombie", "dead", "gone")
# Processes whose VRAM counts as residual (with a holder) rather than as accounted for.
NOT_ACCOUNTED = frozenset(NOT_LIVE + ("disk-sleep",))


def in_nested_pid_namespace(proc_root: Path) -> bool:
    """True when /proc shows a PID namespace below the host's: KFD/NVML PIDs then don't match ours."""
    try:
        for line in (proc_root / "self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) > 2
    except OSError:
        pass
    return False


class Sampler:
    """Takes snapshots of one node. Not thread-safe: one sampler per worker."""

    def __init__(self, settings: Settings, backend: Backend | None = None, *, deep_every_s: float = 10.0,
                 use_pidfds: bool = True):
        self.settings = settings
        self.backend = backend or open_backend(settings)
        self.deep_every_s = deep_every_s
        self._last_deep = float("-inf")
        # (pid, start ticks) -> device files, for processes seen holding GPU device files
        self._holders: dict[tuple[int, int], tuple[str, ...]] = {}
        self._visibility: dict[tuple[int, int], dict[str, str]] = {}
        self._nested_ns = in_nested_pid_namespace(settings.proc_root)
        self._hostname = socket.gethostname()
        # With pidfds, a GPU process's stat is re-read only when it exits, when it is new, while it is in
        # disk sleep, and at the deep-scan cadence. Other state changes (running <-> sleeping, stopped,
        # and entering disk sleep, which only stat shows) are therefore seen at the deep-scan cadence.
        # Without them, every refresh reads every stat, through fds kept open for it.
        held = HeldFiles()
        self._watch = PidWatch(limit=held.limit) \
            if use_pidfds and not self._nested_ns and pidfds_usable(settings.proc_root) else None
        self.procs = ProcReader(settings.proc_root, held=held if self._watch is None else None)
        self._known: dict[int, ProcInfo] = {}  # pid -> facts read while its pidfd was watched
        self._reread_all = True
        # pid -> (what it was built from, the GpuProcess): reused while nothing it shows changed
        self._built: dict[int, tuple[tuple, GpuProcess]] = {}

    def close(self) -> None:
        self.close_readers()
        self.backend.close()

    def close_readers(self) -> None:
        """Close what the sampler itself holds open (pidfds, stat files), leaving the backend open."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self.procs.close()

    # ------------------------------------------------------------------------------------------
    def deep_scan(self) -> None:
        """Find every process holding a GPU device file (reads every /proc/<pid>/fd: seconds apart)."""
        globs = self.backend.device_globs()
        found: dict[tuple[int, int], tuple[str, ...]] = {}
        live = set()
        me = os.getpid() if self.settings.live else None
        for pid in self.procs.pids():
            live.add(pid)
            if pid == me:
                continue  # NVML (and amdsmi) open device files in gpuwarden itself: not a GPU user
            files = self.procs.open_files(pid, globs)
            if not files:
                continue
            info = self.procs.read(pid)
            if info is not None:
                found[(pid, info.start_ticks)] = files
        self._holders = found
        self.procs.forget_dead(live)
        self._visibility = {k: v for k, v in self._visibility.items() if k[0] in live}
        self._last_deep = time.monotonic()
        self._reread_all = True

    def snapshot(self, deep: bool | None = None) -> NodeSnapshot:
        t0 = time.perf_counter()
        if deep or (deep is None and time.monotonic() - self._last_deep >= self.deep_every_s):
            self.deep_scan()
        gpus = tuple(self.backend.gpus())
        usage = self.backend.process_usage()
        processes = self._attribute(gpus, usage)
        baseline, baseline_problem = nodestate.baseline_or_warning(self.settings.state_dir)
        drained_gpus, drained_problem = nodestate.drained_or_warning(self.settings.state_dir)
        drained = tuple(sorted(drained_gpus))
        residual, warnings = self._residual(gpus, processes, usage, baseline)
        warnings.extend(p for p in (baseline_problem, drained_problem) if p)
        if self.backend.simulated:
            why = getattr(self.backend, "fallback_reason", None)
            warnings.insert(0, f"SIMULATED node: no real GPU backend works here ({why})" if why
                            else "SIMULATED node (--backend sim)")
        if not baseline and not baseline_problem:
            warnings.append("no idle baseline recorded: residual counts all unexplained VRAM "
                            "(record one with `gpuwarden baseline record` on an idle node)")
        if self._nested_ns:
            warnings.append("running inside a PID namespace: the driver reports host PIDs, so process "
                            "details may be missing; run gpuwarden on the host (or with the host's PID namespace)")
        engines, arenas = self._engines_and_arenas(warnings)
        warnings.extend(self._config_problem())
        return NodeSnapshot(
            taken_at=time.time(), hostname=self._hostname, backend=self.backend.name,
            simulated=self.backend.simulated, gpus=gpus, processes=processes, residual=residual,
            engines=engines, arenas=arenas, drained=drained, warnings=tuple(warnings),
            baseline_recorded=bool(baseline),
            source=f"bundle:{self.settings.replay}" if self.settings.replay else "live",
            duration_s=round(time.perf_counter() - t0, 6),
        )

    # ------------------------------------------------------------------------------------------
    def _attribute(self, gpus: tuple[GpuInfo, ...], usage: list[ProcessUsage]) -> tuple[GpuProcess, ...]:
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
        fresh: dict[int, tuple[tuple, GpuProcess]] = {}
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

    def _build(self, pid: int, info: ProcInfo | None, usages, files: tuple[str, ...]) -> GpuProcess:
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
        watch = self._watch
        if watch is None:
            return {pid: read(pid) for pid in pids}
        known = self._known
        reread_all, self._reread_all = self._reread_all, False
        exited = watch.exited()
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
            else:
                known.pop(pid, None)
                watch.forget(pid)
            out[pid] = info
        for pid in watch.pids() - out.keys():  # no longer a GPU process: stop watching it
            watch.forget(pid)
            known.pop(pid, None)
        return out

    def _visible(self, info: ProcInfo) -> dict[str, str]:
        key = (info.pid, info.start_ticks)
        if key not in self._visibility:
            self._visibility[key] = self.procs.visibility(info.pid)
        return self._visibility[key]

    def _residual(self, gpus, processes, usage, baseline) -> tuple[tuple[Residual, ...], list[str]]:
        warnings: list[str] = []
        render_to_gpu = {f: g.index for g in gpus for f in g.device_files}
        holders_by_gpu: dict[int, list[Holder]] = {g.index: [] for g in gpus}
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
                reason = "unknown-pid" if self._nested_ns else "kfd-without-process"
            elif state == "disk-sleep":
                reason = "disk-sleep"
            else:
                reason = "zombie"
            gpu_set = set(p.vram) | {render_to_gpu[f] for f in p.device_files if f in render_to_gpu}
            detail = {
                "kfd-without-process": "the driver still charges VRAM to a PID that no longer exists",
                "unknown-pid": "PID not visible from this PID namespace",
                "zombie": f"exited but not reaped by its parent (pid {p.ppid})",
                "disk-sleep": "in uninterruptible sleep: cannot be killed until its I/O returns",
            }[reason]
            holder = Holder(pid=p.pid, start_time=p.start_time, reason=reason, gpus=tuple(sorted(gpu_set)),
                            vram_bytes=sum(p.vram.values()) if p.vram else None, command=p.command or None,
                            ppid=p.ppid, detail=detail)
            if gpu_set:
                for g in gpu_set:
                    holders_by_gpu.setdefault(g, []).append(holder)
            else:
                shared_holders.append(holder)  # holds only /dev/kfd: could be any GPU
        out = []
        for g in gpus:
            accounted = accounted_by_gpu.get(g.index, 0)
            base = baseline.get(g.index)
            res = None
            if g.index in unknown_by_gpu:
                # Without every process's share the difference would blame the wrong thing.
                warnings.append(f"GPU {g.index}: the driver did not say how much VRAM some processes use "
                                "(run as root to see it): residual unknown")
            elif g.vram_used is not None:
                res = g.vram_used - accounted - (base or 0)
            tol = TOLERANCE_WITH_BASELINE if base is not None else TOLERANCE_NO_BASELINE
            tol = max(tol, int((g.vram_total or 0) * TOLERANCE_FRACTION))
            holders = tuple(holders_by_gpu.get(g.index, [])) + tuple(shared_holders)
            significant = res is not None and res > tol
            if significant and not holders:
                warnings.append(f"GPU {g.index}: {fmt_bytes(res)} of VRAM held by no live process and no holder "
                                "found: an ownerless leak that only a GPU reset clears")
            out.append(Residual(gpu_index=g.index, device_used=g.vram_used, accounted=accounted, baseline=base,
                                residual=res, holders=holders, significant=significant))
        return tuple(out), warnings

    def _config_problem(self) -> list[str]:
        # The arena panel would just say "no arena configured": a typo in node.toml must be visible.
        from . import nodeconfig
        if self.settings.replay or not self.settings.config_path.exists():
            return []
        try:
            nodeconfig.load(self.settings)  # cached while the file is unchanged
        except GpuwardenError as exc:
            return [f"node config unusable, arena and launch settings ignored: {exc.message} "
                    "(see `gpuwarden config check`)"]
        return []

    def _engines_and_arenas(self, warnings: list[str]):
        engines, arenas = (), ()
        try:
            from .engines.state import list_engines
            engines = tuple(list_engines(self.settings))
        except Exception as exc:  # a broken state file must not hide the GPUs
            warnings.append(f"engine state unreadable: {exc}")
        try:
            from .arena.watch import list_arenas
            arenas = tuple(list_arenas(self.settings, engines))
        except Exception as exc:
            warnings.append(f"arena state unreadable: {exc}")
        return engines, arenas


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
