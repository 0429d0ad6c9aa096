"""Append-only journal of every action that changes the node: who, when, what, result.

One JSON object per line in <state dir>/journal.log, appended under flock so lines never interleave.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from . import statedir


def who() -> str:
    """The operator: the user name, and the sudo user behind it when there is one."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry (containers): KeyError before 3.13, OSError after
        user = str(os.geteuid())
    sudo = os.environ.get("SUDO_USER")
    return f"{user} (sudo from {sudo})" if sudo and sudo != user else user


FLEET_ORIGIN_ENV = "GPUWARDEN_FLEET_ORIGIN"


def fleet_origin() -> dict[str, str]:
    """`via` and the operator behind it when `gpuwarden fleet` started this command over SSH (empty otherwise).

    The SSH login ("who") stays the authority; this says which console operator asked, for the record."""
    origin = os.environ.get(FLEET_ORIGIN_ENV, "")
    clean = "".join(c for c in origin if c.isprintable())[:200]
    return {"via": "fleet", "operator": clean} if clean else {}


def write(state_dir: Path, action: str, result: str, **details: Any) -> dict[str, Any]:
    """Append one entry and return it. `result` is e.g. "ok", "failed", "skipped", "started"."""
    entry = {
        "ts": time.time(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "who": who(),
        "pid": os.getpid(),
        "action": action,
        "result": result,
        **fleet_origin(),
        **details,
    }
    path = statedir.ensure(state_dir) / statedir.JOURNAL
    line = json.dumps(entry, default=str, sort_keys=False) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return entry


def read(state_dir: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Entries oldest first (the last `limit` when given); unreadable lines are skipped."""
    path = state_dir / statedir.JOURNAL
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return iter(())
    if limit is not None:
        lines = lines[-limit:]
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return iter(out)
