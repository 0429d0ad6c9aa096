"""What several test files share with test_reaper_family.py: FAMILY, holds_sim_vram, start_family.

Taken out of test_reaper_family.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


# Runs as `python -c`: argv[1] is "direct" (the tenant is the subreaper's child) or "bad-parent"
# (a middle process starts the tenant and never waits for it); the rest is the tenant's argv.
FAMILY = r'''
import ctypes, os, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
if os.environ.get("FAMILY_COMM"):
    libc.prctl(15, os.environ["FAMILY_COMM"].encode(), 0, 0, 0)  # PR_SET_NAME: pose as a container shim
mode, argv = sys.argv[1], sys.argv[2:]
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    os.close(r)
    if mode == "bad-parent":
        tenant = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        os.write(w, f"{os.getpid()} {tenant.pid}\n".encode())
        tenant._child_created = False  # keep Popen's finaliser from ever reaping it
        while True:
            time.sleep(3600)
    os.write(w, f"{os.getppid()} {os.getpid()}\n".encode())
    os.execvp(argv[0], argv)
os.close(w)
sys.stdout.write(os.read(r, 100).decode())
sys.stdout.flush()
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.05)
'''


@dataclass
class Family:
    keeper: subprocess.Popen  # the subreaper
    parent: int  # the tenant's parent (the keeper itself in "direct" mode)
    tenant: int

    def stop(self) -> None:
        for pid in (self.tenant, self.parent):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.keeper.kill()
        self.keeper.wait(10)


def start_family(argv: list[str], *, mode: str = "bad-parent", env: dict[str, str] | None = None,
                 ready: str | None = None, timeout: float = 20.0) -> Family:
    """Start a family; with `ready`, wait until the tenant has printed that to stdout of its own file."""
    keeper = subprocess.Popen([sys.executable, "-c", FAMILY, mode, *argv], stdout=subprocess.PIPE,
                              env={**os.environ, **(env or {})}, text=True)
    assert keeper.stdout is not None
    line = keeper.stdout.readline().split()
    parent, tenant = int(line[0]), int(line[1])
    return Family(keeper, parent, tenant)


def holds_sim_vram(state_dir: Path, pid: int) -> bool:
    """True once the simulated driver has charged VRAM to `pid`."""
    return any(p.name.startswith(f"{pid}-") for p in (state_dir / "sim" / "allocs").glob("*.json"))
