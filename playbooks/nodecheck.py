"""What the node-changing playbooks ask of a snapshot: does the GPU exist, who uses it, is it idle again.

Drain, reset, purge and baseline share these so "idle" and "in use" mean one thing everywhere.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ops.errors import NotFound, Refused
from ops.model import GpuInfo, GpuProcess, NodeSnapshot
from ops.settings import Settings
from ops.units import fmt_bytes


def snapshot(settings: Settings) -> NodeSnapshot:
    """A fresh full snapshot of the live node (refused on a captured tree: nothing there can change)."""
    if settings.replay is not None:
        raise Refused(f"this is a replay of {settings.replay}: nothing on it can be changed",
                      "run the playbook on the node itself")
    from ops.snapshot import take_snapshot
    return take_snapshot(settings)


def require_gpu(snap: NodeSnapshot, index: int) -> GpuInfo:
    gpu = snap.gpu(index)
    if gpu is None:
        have = ", ".join(str(g.index) for g in snap.gpus) or "none"
        raise NotFound(f"no GPU {index} on this node (GPUs: {have})",
                       "see `gpuwarden status` for the GPU indexes")
    return gpu


def users(snap: NodeSnapshot, index: int) -> list[GpuProcess]:
    """Processes that use GPU `index`: VRAM charged to them there, or its device file held open.

    gpuwarden itself is left out: reading NVML or amdsmi opens the GPUs' device files.
    """
    gpu = snap.gpu(index)
    files = set(gpu.device_files) if gpu else set()
    me = os.getpid()
    return [p for p in snap.processes if p.pid != me and (index in p.vram or files.intersection(p.device_files))]


def live_users(snap: NodeSnapshot, index: int) -> list[GpuProcess]:
    return [p for p in users(snap, index) if p.alive]


def describe(p: GpuProcess, index: int | None = None) -> str:
    size = f", {fmt_bytes(p.vram[index])}" if index is not None and index in p.vram else ""
    return f"pid {p.pid} ({p.state}{size}) {p.command[:60] or '(gone)'}"


@dataclass(frozen=True)
class Idle:
    """Whether one GPU is idle: nobody uses it and its VRAM is back to the baseline."""

    gpu: int
    ok: bool
    present: bool
    problems: tuple[str, ...]


def idle_state(snap: NodeSnapshot, index: int) -> Idle:
    gpu = snap.gpu(index)
    if gpu is None:
        return Idle(index, False, False, (f"GPU {index} does not enumerate",))
    problems = [f"used by {describe(p, index)}" for p in users(snap, index)]
    res = next((r for r in snap.residual if r.gpu_index == index), None)
    if res is not None:
        if res.significant:
            what = "baseline" if res.baseline is not None else "idle (no baseline recorded)"
            problems.append(f"{fmt_bytes(res.residual or 0)} of VRAM above {what} held by no live process")
        for h in res.holders:
            if h.pid is not None and not any(f"pid {h.pid} " in p for p in problems):
                problems.append(f"pid {h.pid} holds it ({h.reason})")
    return Idle(index, not problems, True, tuple(problems))


def wait_idle(settings: Settings, gpus: list[int], timeout_s: float, *, poll_s: float = 0.25,
              cancelled=None) -> tuple[NodeSnapshot, dict[int, Idle]]:
    """Poll until every GPU in `gpus` is idle or the timeout passes; returns the last look."""
    def look(snap: NodeSnapshot):
        states = {g: idle_state(snap, g) for g in gpus}
        return (snap, states), all(s.ok for s in states.values())
    return _poll(settings, look, timeout_s, poll_s, cancelled)


def _poll(settings: Settings, look, timeout_s: float, poll_s: float, cancelled):
    """Take snapshots until look(snap) says done, the timeout passes or the run is cancelled.

    Right after a reset the GPU can vanish for a while and a backend call fail: that is retried with a
    fresh backend (old handles may be stale) until the deadline, then reported.
    """
    from ops.errors import GpuwardenError
    from ops.snapshot import Sampler
    deadline = time.monotonic() + timeout_s
    sampler = None
    try:
        while True:
            try:
                sampler = sampler or Sampler(settings, deep_every_s=0.0)
                result, done = look(sampler.snapshot(deep=True))
            except GpuwardenError as exc:
                if sampler is not None:
                    sampler.close()
                    sampler = None
                if time.monotonic() >= deadline:
                    raise GpuwardenError(f"cannot read the GPUs: {exc.message}", exc.hint) from None
                time.sleep(poll_s)
                continue
            if done or time.monotonic() >= deadline or (cancelled is not None and cancelled.is_set()):
                return result
            time.sleep(poll_s)
    finally:
        if sampler is not None:
            sampler.close()


def scope(snap: NodeSnapshot, gpu: int | None) -> list[int]:
    """[gpu] after checking it exists, or every GPU when None."""
    if gpu is None:
        return [g.index for g in snap.gpus]
    require_gpu(snap, gpu)
    return [gpu]


def hive_peers(snap: NodeSnapshot, index: int) -> list[int]:
    """Other GPUs of the same XGMI hive as `index` (a reset of one can reach them all)."""
    gpu = snap.gpu(index)
    if gpu is None or not gpu.hive_id:
        return []
    return [g.index for g in snap.gpus if g.index != index and g.hive_id == gpu.hive_id]


def residual_left(snap: NodeSnapshot, index: int) -> tuple[int | None, tuple]:
    """(unexplained bytes when significant else None, holders) for GPU `index`: what purge must clear."""
    res = next((r for r in snap.residual if r.gpu_index == index), None)
    if res is None:
        return None, ()
    return (res.residual if res.significant else None), res.holders


def wait_residual_gone(settings: Settings, gpus: list[int], timeout_s: float, *, poll_s: float = 0.25,
                       cancelled=None) -> dict[int, tuple[int | None, tuple]]:
    """Poll until no GPU in `gpus` has significant residual or holders; returns what is left per GPU."""
    def look(snap: NodeSnapshot):
        left = {g: residual_left(snap, g) for g in gpus}
        left = {g: v for g, v in left.items() if v[0] is not None or v[1]}
        return left, not left
    return _poll(settings, look, timeout_s, poll_s, cancelled)
