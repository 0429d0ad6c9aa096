"""HeldFiles when its owner closes it while a deadline lane still reads through it: the sampler of an
interrupted playbook closes in a `finally` while a lane thread, abandoned at the deadline, goes on.

CI saw the double close this allowed: Ctrl-C during drain's wait-idle ended as "FAILED: OSError: [Errno 9] Bad
file descriptor" instead of "interrupted", because close() closed a descriptor the lane had just dropped.
"""

from __future__ import annotations

import os
import sys
import threading

from gpuwarden.ops.foundation.fdbudget import FdBudget
from gpuwarden.ops.foundation.heldfiles import HeldFiles


def _close_while_a_lane_drops_and_reads(paths: list[str]) -> list[BaseException]:
    """One round: every path held, then close() in this thread while one thread drops them all and another
    reads them all, the three started together; what any of them raised."""
    held = HeldFiles(budget=FdBudget(10_000))
    for p in paths:
        assert held.read(p) is not None
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def lane(work) -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 (the test reports it)
            errors.append(exc)
    threads = [threading.Thread(target=lane, args=(lambda: [held.drop(p) for p in reversed(paths)],)),
               threading.Thread(target=lane, args=(lambda: [held.read(p) for p in paths],))]
    for t in threads:
        t.start()
    start.wait()
    try:
        held.close()
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    for t in threads:
        t.join()
    held.close()  # what a late read held again
    assert len(held) == 0
    return errors


def test_close_racing_drops_and_reads_closes_each_descriptor_once(tmp_path, monkeypatch):
    paths = []
    for i in range(300):
        p = tmp_path / f"attr{i}"
        p.write_text(f"{i}\n")
        paths.append(str(p))
    # Every descriptor opened and closed in the process is tracked: a close of one that is not open (closed
    # already, by the other thread) is a double close, whether the kernel would say EBADF or the number had been
    # handed to another open meanwhile.
    real_open, real_close = os.open, os.close
    open_now: set[int] = set()
    double: list[int] = []

    def tracking_open(*args, **kwargs) -> int:
        fd = real_open(*args, **kwargs)
        open_now.add(fd)
        return fd

    def tracking_close(fd: int) -> None:
        if fd in open_now:
            open_now.discard(fd)
        else:
            double.append(fd)
        real_close(fd)
    monkeypatch.setattr(os, "open", tracking_open)
    monkeypatch.setattr(os, "close", tracking_close)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: the race every round
    try:
        for _ in range(60):
            double.clear()
            errors = _close_while_a_lane_drops_and_reads(paths)
            assert errors == [], errors
            assert double == [], f"descriptors closed twice: {double}"
    finally:
        sys.setswitchinterval(before)
