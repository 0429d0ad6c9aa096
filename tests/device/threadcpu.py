"""Every thread's CPU of a few processes over one window, from /proc/<pid>/task/<tid>/schedstat (ns, exact):
how the device scripts (agent_contention.sh, agent_vs_peers.sh) weigh the agent against its peers."""

from __future__ import annotations

import os
import time


def threads(pid: int) -> dict[str, int]:
    """'tid comm' -> CPU ns so far, for each thread of `pid` alive now."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            out[f"{tid} {comm}"] = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except OSError:  # the thread ended meanwhile
            pass
    return out


def measure(named: list[tuple[str, int]], seconds: float) -> tuple[dict[str, dict[str, int]], float]:
    """name -> 'tid comm' -> CPU ns each thread spent during a window of `seconds`, and the window's length."""
    before = {name: threads(pid) for name, pid in named}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    after = {name: threads(pid) for name, pid in named}
    return {name: {k: ns - before[name].get(k, 0) for k, ns in after[name].items()} for name, _ in named}, elapsed


def last_cpu(pid: int, key: str) -> str:
    """The CPU a thread ('tid comm') last ran on (field 39 of its stat): who shares a core with whom."""
    try:
        return open(f"/proc/{pid}/task/{key.split()[0]}/stat").read().rsplit(")", 1)[1].split()[36]
    except OSError:
        return "?"
