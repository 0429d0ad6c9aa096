"""The registration gate: a K-slot semaphore of flock()ed files, so at most K engines register at once.

A slot is an open fd holding LOCK_EX on slot-<i>.lock; when its holder dies the kernel drops the
lock, so a crash can never wedge the gate. Engines find it via GPUWARDEN_GATE_DIR/_SLOTS. The slot
protocol is written down in README.md ("The registration gate's slot protocol"); native/gate.c is the
same protocol in C, inside the registration interposer.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.ops.foundation import statedir, statefiles
from gpuwarden.ops.foundation.errors import GpuwardenError

ENV_DIR = "GPUWARDEN_GATE_DIR"
ENV_SLOTS = "GPUWARDEN_GATE_SLOTS"
MAX_SLOTS = 1024  # a slot is a file: a typo such as 1e20 must not become a loop over that many


class GateTimeout(GpuwardenError):
    """No slot came free in time."""


@dataclass
class Slot:
    index: int
    fd: int
    path: Path

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        os.close(self.fd)  # closing the last fd drops the flock
        self.fd = -1

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def slot_paths(gate_dir: Path, slots: int) -> list[Path]:
    return [gate_dir / f"slot-{i}.lock" for i in range(slots)]


def acquire(gate_dir: Path, slots: int, who: str = "", timeout_s: float | None = None,
            poll_s: float = 0.02) -> Slot:
    """Take a free slot, waiting up to timeout_s (None: forever); raise GateTimeout after that."""
    if not 1 <= slots <= MAX_SLOTS:
        raise GpuwardenError(f"the registration gate has 1 to {MAX_SLOTS} slots, not {slots}")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    paths = slot_paths(gate_dir, slots)
    # Start at a pid-dependent slot so waiters don't all hammer slot-0 first.
    start = os.getpid() % slots
    while True:
        for k in range(slots):
            i = (start + k) % slots
            fd = _open_slot(gate_dir, paths[i].name, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "who": who, "since": time.time()}).encode(), 0)
            return Slot(i, fd, paths[i])
        if deadline is not None and time.monotonic() >= deadline:
            raise GateTimeout(
                f"no registration slot free in {gate_dir} after {timeout_s:.0f}s ({slots} slot(s), all held)",
                "see `gpuwarden engines list` for who is registering; raise the timeout or the stagger",
            )
        time.sleep(poll_s)


def _open_slot(gate_dir: Path, name: str, flags: int) -> int:
    # Through statedir's checked opens: a planted symlink slot-<i>.lock must not get its target truncated.
    # Opened from its parent (the state dir), so the gate dir itself cannot be a planted link either.
    with statedir.open_dir(gate_dir.parent, gate_dir.name, create=bool(flags & os.O_CREAT)) as d:
        return d.open(name, flags, 0o600)


def acquire_from_env(who: str = "", timeout_s: float | None = None) -> Slot | None:
    """Take a slot of the gate named by the environment; None when no gate is configured."""
    gate_dir = os.environ.get(ENV_DIR)
    if not gate_dir:
        return None
    slots = int(os.environ.get(ENV_SLOTS, "1") or 1)
    return acquire(Path(gate_dir), slots, who=who, timeout_s=timeout_s)


def holders(gate_dir: Path, slots: int) -> list[dict[str, Any]]:
    """The slots held right now: [{"slot": i, "pid": ..., "who": ..., "since": ...}]."""
    out = []
    for i, path in enumerate(slot_paths(gate_dir, slots)):
        try:
            fd = _open_slot(gate_dir, path.name, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                continue
            except BlockingIOError:
                pass
            try:
                info = statefiles.parse(os.pread(fd, 4096, 0) or b"{}", statefiles.SLOT_INFO, path)
            except (OSError, GpuwardenError):
                info = {}
            out.append({"slot": i, **info})
        finally:
            os.close(fd)
    return out
