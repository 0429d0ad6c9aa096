"""What several test files share with test_fleet_tui.py: fleet_target, until.

Taken out of test_fleet_tui.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import time


async def until(pilot, predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def fleet_target(ssh_fleet, nodelist: str):
    from gpuwarden.playbooks.fleet.target import resolve
    return resolve(hosts_file=None, hosts_from=None, group=None, nodelist=nodelist,
                   fleet_config=None, ssh_config=ssh_fleet.ssh_config,
                   accept_new=False, parallel=None, timeout=10, remote_command=None)
