"""What `gpuwarden post-clean` (a preStop hook) waits for: the pod's own processes leaving its GPUs.

The pod is the caller's (its /proc/self/cgroup) unless named; processes are matched by the pod UID in
their cgroup, so no API access is needed. The purge itself is the purge playbook, guards and all.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from gpuwarden.ops.foundation.model import GpuProcess, NodeSnapshot
from gpuwarden.ops.k8s.attribution import PodAttributor


def ancestors(pid: int, proc_root: Path) -> set[int]:
    """pid and its parents up to init: the hook's own chain is never waited for."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = (proc_root / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rfind(")") + 2:].split()[1])
    return out


def pod_users(snap: NodeSnapshot, pod_uid: str, gpus: list[int] | None, attributor: PodAttributor,
              exclude: set[int]) -> list[GpuProcess]:
    """Live processes of the pod that use any of `gpus` (any GPU when None)."""
    out = []
    for p in snap.processes:
        if p.pid in exclude or not p.alive:
            continue
        cg = attributor.cgroup(p.pid, p.start_time)
        if cg is None or cg.pod_uid != pod_uid:
            continue
        if gpus is None or set(p.vram) & set(gpus) or p.device_files:
            out.append(p)
    return out


def wait_pod_gone(take: Callable[[], NodeSnapshot], pod_uid: str, gpus: list[int] | None, proc_root: Path,
                  timeout_s: float, progress: Callable[[str], None], poll_s: float = 0.5
                  ) -> tuple[NodeSnapshot, list[GpuProcess]]:
    attributor = PodAttributor(proc_root)
    exclude = ancestors(os.getpid(), proc_root)
    deadline = time.monotonic() + timeout_s
    said = None
    while True:
        snap = take()
        left = pod_users(snap, pod_uid, gpus, attributor, exclude)
        if not left or time.monotonic() >= deadline:
            return snap, left
        line = "waiting for " + ", ".join(f"pid {p.pid} ({p.command[:40]})" for p in left[:4])
        if line != said:
            progress(line)
            said = line
        time.sleep(poll_s)
