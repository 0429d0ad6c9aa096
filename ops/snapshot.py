"""One NodeSnapshot: GPUs from the backend, processes attributed to them, residual VRAM and holders.

Sampler keeps caches between refreshes (process facts per identity, the set of device-file
holders from the last deep scan) so a 1 Hz refresh reads only what can have changed.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from . import nodestate
from .backends.base import Backend
from .backends.select import open_backend
from .model import GpuInfo, GpuProcess, Holder, NodeSnapshot, ProcessUsage, Residual
from .heldfiles import HeldFiles
from .procs import ProcInfo, ProcReader
from .settings import Settings
from .units import fmt_bytes

# Below these, unexplained VRAM is driver noise, not a tenant's leftovers.
TOLERANCE_WITH_BASELINE = 256 << 20
TOLERANCE_NO_BASELINE = 512 << 20
TOLERANCE_FRACTION = 0.01

NOT_LIVE = ("zombie", "dead", "gone")


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

    def __init__(self, settings: Settings, backend: Backend | None = None, *, deep_every_s: float = 10.0):
        self.settings = settings
        self.backend = backend or open_backend(settings)
        self.procs = ProcReader(settings.proc_root, held=HeldFiles())
        self.deep_every_s = deep_every_s
        self._last_deep = float("-inf")
        # (pid, start ticks) -> device files, for processes seen holding GPU device files
        self._holders: dict[tuple[int, int], tuple[str, ...]] = {}
        self._visibility: dict[tuple[int, int], dict[str, str]] = {}
        self._nested_ns = in_nested_pid_namespace(settings.proc_root)
        self._hostname = socket.gethostname()

    def close(self) -> None:
        self.backend.close()

    # ------------------------------------------------------------------------------------------
    def deep_scan(self) -> None:
        """Find every process holding a GPU device file (reads every /proc/<pid>/fd: seconds apart)."""
        globs = self.backend.device_globs()
        found: dict[tuple[int, int], tuple[str, ...]] = {}
        live = set()
        for pid in self.procs.pids():
            live.add(pid)
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

    def snapshot(self, deep: bool | None = None) -> NodeSnapshot:
        t0 = time.perf_counter()
        if deep or (deep is None and time.monotonic() - self._last_deep >= self.deep_every_s):
            self.deep_scan()
        gpus = tuple(self.backend.gpus())
        usage = self.backend.process_usage()
        processes = self._attribute(gpus, usage)
        baseline = nodestate.baseline(self.settings.state_dir)
        drained = tuple(sorted(nodestate.drained(self.settings.state_dir)))
        residual, warnings = self._residual(gpus, processes, usage, baseline)
        if self.backend.simulated:
            why = getattr(self.backend, "fallback_reason", None)
            warnings.insert(0, f"SIMULATED node: no real GPU backend works here ({why})" if why
                            else "SIMULATED node (--backend sim)")
        if not baseline:
            warnings.append("no idle baseline recorded: residual counts all unexplained VRAM "
                            "(record one with `gpuwarden baseline record` on an idle node)")
        if self._nested_ns:
            warnings.append("running inside a PID namespace: the driver reports host PIDs, so process "
                            "details may be missing; run gpuwarden on the host (or with the host's PID namespace)")
        engines, arenas = self._engines_and_arenas(warnings)
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
            by_pid.setdefault(u.pid, []).append(u)
        holder_files: dict[int, tuple[str, ...]] = {}
        for (pid, ticks), files in self._holders.items():
            holder_files[pid] = files
        out = []
        for pid in sorted(set(by_pid) | set(holder_files)):
            info = self.procs.read(pid)
            if info is None and pid not in by_pid:
                continue  # a device holder that exited cleanly: nothing left behind
            vram: dict[int, int] = {}
            sources: dict[int, str] = {}
            for u in by_pid.get(pid, ()):
                vram[u.gpu_index] = vram.get(u.gpu_index, 0) + u.vram_bytes
                sources[u.gpu_index] = u.source
            files = ()
            if info is not None and (pid, info.start_ticks) in self._holders:
                files = self._holders[(pid, info.start_ticks)]
            out.append(GpuProcess(
                pid=pid,
                start_time=info.start_time if info else None,
                user=info.user if info else None,
                command=info.command if info else "",
                state=info.state if info else "gone",
                ppid=info.ppid if info else None,
                cgroup=info.cgroup if info else None,
                container=info.container if info else None,
                vram=vram, sources=sources, device_files=files,
                visible_devices=self._visible(info) if info else {},
            ))
        return tuple(out)

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
        for p in processes:
            reason = None
            if p.state == "gone":
                reason = "unknown-pid" if self._nested_ns else "kfd-without-process"
            elif p.state in ("zombie", "dead"):
                reason = "zombie"
            elif p.state == "disk-sleep":
                reason = "disk-sleep"
            if reason is None:
                continue
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
        accounted_by_gpu: dict[int, int] = {}
        unknown_by_gpu: set[int] = set()
        for p in processes:
            if p.state in NOT_LIVE or p.state == "disk-sleep":
                continue
            for gi, b in p.vram.items():
                accounted_by_gpu[gi] = accounted_by_gpu.get(gi, 0) + b
                if p.sources.get(gi) == "nvml-unknown":
                    unknown_by_gpu.add(gi)
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

    def _engines_and_arenas(self, warnings: list[str]):
        engines, arenas = (), ()
        try:
            from .engines.state import list_engines
            engines = tuple(list_engines(self.settings))
        except Exception as exc:  # a broken state file must not hide the GPUs
            warnings.append(f"engine state unreadable: {exc}")
        try:
            from .arena.watch import list_arenas
            arenas = tuple(list_arenas(self.settings))
        except Exception as exc:
            warnings.append(f"arena state unreadable: {exc}")
        return engines, arenas


def take_snapshot(settings: Settings, backend: Backend | None = None, *, deep: bool = True) -> NodeSnapshot:
    """One full snapshot (with a deep scan for device-file holders), for one-shot commands."""
    sampler = Sampler(settings, backend)
    try:
        return sampler.snapshot(deep=deep)
    finally:
        if backend is None:
            sampler.close()
