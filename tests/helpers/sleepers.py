"""How often a thread went to sleep, from the kernel: the tests that check an idle thread stays asleep count it.

A voluntary context switch is the thread blocking (in poll, a futex, a read); a timer loop shows as many of them."""

from __future__ import annotations

from pathlib import Path


def sleeps(pid: int, tid: int) -> int:
    """voluntary_ctxt_switches of thread `tid` of process `pid` (/proc/<pid>/task/<tid>/status)."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def sleeps_by_thread(pid: int) -> dict[str, int]:
    """sleeps() of every thread of `pid`, keyed "<kernel name>/<tid>" (a thread that ended meanwhile is left out)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[f"{(task / 'comm').read_text().strip()}/{task.name}"] = sleeps(pid, int(task.name))
        except (OSError, StopIteration):
            continue
    return out
