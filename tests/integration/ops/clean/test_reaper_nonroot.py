"""purge run by an ordinary user: another user's processes are reported, never signalled; root-only
steps say so. Runs the real CLI as `nobody` through setpriv, so it needs root to start."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.simnode import cli_argv
from helpers.reaper_family import holds_sim_vram, start_family
from helpers.simnode import proc_state, wait_for
from helpers.journal import read_journal

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv to run gpuwarden as another user")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(state_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir),
                           "--backend", "sim", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.fixture
def shared_state():
    # pytest's tmp_path sits under a root-only folder; nobody needs a path it can reach.
    base = Path(tempfile.mkdtemp(prefix="gw-nonroot-"))
    os.chmod(base, 0o777)
    state = base / "state"
    proc = as_nobody(state, "sim", "init", "--gpus", "2")
    if proc.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"cannot run gpuwarden as nobody here: {proc.stderr.strip()[-200:]}")
    yield state
    shutil.rmtree(base, ignore_errors=True)


def test_another_users_careless_parent_is_reported_not_signalled(shared_state):
    state = shared_state
    # The tenant runs as nobody (it writes the sim driver's files); its careless parent is root's.
    fam = start_family([*NOBODY, *cli_argv(state, "sim", "hold", "--gpu", "1", "--size", "2GiB")])
    try:
        assert wait_for(lambda: holds_sim_vram(state, fam.tenant), 20)
        os.kill(fam.tenant, signal.SIGKILL)
        assert wait_for(lambda: proc_state(fam.tenant) == "Z", 5)
        proc = as_nobody(state, "purge", "1", "--yes", "--timeout", "0.5", "--drop-caches", "--json")
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        assert proc.returncode == 1
        step = next(e for e in events if e["step"] == f"pid-{fam.tenant}" and e["kind"] == "step_failed")
        assert "belongs to another user (uid 0)" in step["message"]
        skipped = next(e for e in events if e["step"] == "drop-caches" and e["kind"] == "step_skipped")
        assert "needs root" in skipped["message"]
        assert proc_state(fam.tenant) == "Z" and proc_state(fam.parent) in ("S", "R")
        journal = read_journal(state)
        assert not any(e["action"] == "reaper-signal" and e["result"] == "ok" for e in journal)
    finally:
        fam.stop()
