"""What several test files share with test_canary.py: make_arena, spawn, wait_phase.

Taken out of test_canary.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from helpers.paths import REPO
from gpuwarden.ops.foundation.status_protocol import read_events


def make_arena(path: Path, size: int = 4 << 20) -> Path:
    from gpuwarden.ops.arena.create import create
    create(path, size=size, chunk_size=1 << 20)
    return path


def spawn(arena: Path, status: Path, state_dir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    full = {**os.environ, "GPUWARDEN_STATUS_FILE": str(status), "GPUWARDEN_STATE_DIR": str(state_dir), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "gpuwarden.ops.canary", "--arena", str(arena), *args], cwd=REPO, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_phase(status: Path, phase: str, proc: subprocess.Popen | None = None, timeout: float = 20) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = read_events(status)
        if any(e.phase == phase for e in events):
            return events
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"canary ended ({proc.returncode}) before {phase}: {proc.stderr.read()}")
        time.sleep(0.02)
    raise AssertionError(f"no {phase} within {timeout}s: {[e.phase for e in read_events(status)]}")
