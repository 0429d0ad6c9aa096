"""What several test files share with test_purge.py: spawn_with_pid.

Taken out of test_purge.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import subprocess


def spawn_with_pid(pid: int, argv: list[str], tries: int = 20) -> subprocess.Popen | None:
    """Start argv as PID `pid` through ns_last_pid (root only); None when another fork keeps winning."""
    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(argv)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None
