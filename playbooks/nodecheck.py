"""What the node-changing playbooks ask of a snapshot: does the GPU exist, who uses it, is it idle again.

Drain, reset, purge and baseline share these so "idle" and "in use" mean one thing everywhere.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound, Refused
from gpuwarden.ops.foundation.model import GpuInfo, GpuProcess, NodeSnapshot
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.sampling.sampler import Sampler, take_snapshot

# Holder reasons with no process left to signal: only the driver (a reset) frees that memory.
NO_PROCESS = ("kfd-without-process", "unknown-pid", "ownerless")


def snapshot(settings: Settings) -> NodeSnapshot:
    """A fresh full snapshot of the live node (refused on a captured tree: nothing there can change)."""
    if settings.replay is not None:
        raise Refused(f"this is a replay of {settings.replay}: nothing on it can be changed",
                      "run the playbook on the node itself")
    return take_snapshot(settings)


def require_gpu(snap: NodeSnapshot, index: int) -> GpuInfo:
    gpu = snap.gpu(index)
    if gpu is None:
        have = ", ".join(str(g.index) for g in snap.gpus) or "none"
        raise NotFound(f"no GPU {index} on this node (GPUs: {have})",
                       "see `gpuwarden status` for the GPU indexes")
    return gpu


def unreadable(snap: NodeSnapshot, index: int) -> str | None:
    """Why what a snapshot says about GPU `index` cannot be acted on (a read of it, or of the driver's per-process
    files, did not answer in time); None when it can."""
    gpu = snap.gpu(index)
    if gpu is not None and gpu.stale is not None:
        return (f"GPU {index}'s state could not be read: {gpu.stale.source} read of {gpu.stale.what} did not answer "
                f"in {gpu.stale.deadline_s:g} s (the GPU may be hung), so who uses it is not known")
    for w in snap.warnings:
        if w.code == "stale" and w.gpu is None:
            return f"who uses GPU {index} is not known: {w.message}"
    return None


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


def ownerless_only(snap: NodeSnapshot, index: int) -> int | None:
    """Bytes of residual on GPU `index` when that is all that is wrong with it (no process uses or holds
    it: only a reset frees that memory); None otherwise."""
    left, holders = residual_left(snap, index)
    if left is None or process_holders(holders) or users(snap, index):
        return None
    return left


def wait_idle_or_ownerless(settings: Settings, gpus: list[int], timeout_s: float, *, settle_s: float = 2.0,
                           poll_s: float = 0.25, cancelled=None) -> tuple[NodeSnapshot, dict[int, Idle]]:
    """wait_idle, except that it stops early once the only thing left is residual VRAM no process holds
    and it has not changed for `settle_s`: that memory never comes back without a reset."""
    seen: dict = {"sizes": None, "since": 0.0}

    def look(snap: NodeSnapshot):
        states = {g: idle_state(snap, g) for g in gpus}
        if all(s.ok for s in states.values()):
            return (snap, states), True
        sizes = {g: ownerless_only(snap, g) for g, s in states.items() if not s.ok}
        if any(v is None for v in sizes.values()):
            seen["sizes"] = None
            return (snap, states), False
        now = time.monotonic()
        if sizes != seen["sizes"]:
            seen["sizes"], seen["since"] = sizes, now
        return (snap, states), now - seen["since"] >= settle_s
    return _poll(settings, look, timeout_s, poll_s, cancelled)


def _poll(settings: Settings, look, timeout_s: float, poll_s: float, cancelled):
    """Take snapshots until look(snap) says done, the timeout passes or the run is cancelled.

    Right after a reset the GPU can vanish for a while and a backend call fail: that is retried with a
    fresh backend (old handles may be stale) until the deadline, then reported.
    """
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


def device_peers(snap: NodeSnapshot, index: int) -> list[int]:
    """Other partitions (logical GPUs) of the physical device GPU `index` is part of: they share its bus id."""
    gpu = snap.gpu(index)
    if gpu is None or not gpu.bus_id:
        return []
    return [g.index for g in snap.gpus if g.index != index and g.bus_id == gpu.bus_id]


def reset_peers(snap: NodeSnapshot, index: int) -> list[int]:
    """Every other GPU a reset of `index` takes down: its XGMI hive and the partitions of its device."""
    return list(dict.fromkeys(hive_peers(snap, index) + device_peers(snap, index)))


def residual_left(snap: NodeSnapshot, index: int) -> tuple[int | None, tuple]:
    """(unexplained bytes when significant else None, holders) for GPU `index`: what purge must clear."""
    res = next((r for r in snap.residual if r.gpu_index == index), None)
    if res is None:
        return None, ()
    return (res.residual if res.significant else None), res.holders


def process_holders(holders: tuple) -> list:
    """The holders that are a process something can act on (not a driver entry with no process behind it)."""
    return [h for h in holders if h.pid is not None and h.reason not in NO_PROCESS]


def wait_residual_settled(settings: Settings, gpus: list[int], timeout_s: float, *, settle_s: float = 1.0,
                          poll_s: float = 0.25, cancelled=None) -> dict[int, tuple[int | None, tuple]]:
    """Poll until the residual on `gpus` is gone, or only ownerless residual is left and it has stayed the
    same for `settle_s` (memory no process holds will not come back without a reset: no point waiting
    out the whole timeout for it). Returns what is left per GPU, as wait_residual_gone does."""
    seen: dict = {"left": None, "since": 0.0}

    def look(snap: NodeSnapshot):
        left = {g: residual_left(snap, g) for g in gpus}
        left = {g: v for g, v in left.items() if v[0] is not None or v[1]}
        if not left:
            return left, True
        if any(process_holders(h) for _, h in left.values()):
            seen["left"] = None
            return left, False
        sizes = {g: v[0] for g, v in left.items()}
        now = time.monotonic()
        if sizes != seen["left"]:
            seen["left"], seen["since"] = sizes, now
        return left, now - seen["since"] >= settle_s
    return _poll(settings, look, timeout_s, poll_s, cancelled)


def wait_unused(settings: Settings, gpus: list[int], timeout_s: float, *, ignore: set[int] = frozenset(),
                poll_s: float = 0.25, cancelled=None) -> dict[int, list[GpuProcess]]:
    """Poll until no live process (other than `ignore`) uses any GPU in `gpus`; returns who still does."""
    def look(snap: NodeSnapshot):
        busy = {g: [p for p in live_users(snap, g) if p.pid not in ignore] for g in gpus}
        busy = {g: ps for g, ps in busy.items() if ps}
        return busy, not busy
    return _poll(settings, look, timeout_s, poll_s, cancelled)


def wait_residual_gone(settings: Settings, gpus: list[int], timeout_s: float, *, poll_s: float = 0.25,
                       cancelled=None) -> dict[int, tuple[int | None, tuple]]:
    """Poll until no GPU in `gpus` has significant residual or holders; returns what is left per GPU."""
    def look(snap: NodeSnapshot):
        left = {g: residual_left(snap, g) for g in gpus}
        left = {g: v for g, v in left.items() if v[0] is not None or v[1]}
        return left, not left
    return _poll(settings, look, timeout_s, poll_s, cancelled)
