"""What several test files share with test_fleet_ssh.py: fleet, rows.

Taken out of test_fleet_ssh.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import json
from helpers.cli import gpuwarden
from helpers.sshfleet import client_env
from gpuwarden.ops.foundation import jsondoc


def fleet(ssh_fleet, *args: str, timeout: float = 120, **kw):
    return gpuwarden("fleet", *args, env=client_env(ssh_fleet), timeout=timeout, **kw)


def rows(proc) -> dict[str, dict]:
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    return {n["node"]: n for n in doc["nodes"]}
