"""The exit-code table of docs/state-dir.md, row by row, on the simulated node with real processes and signals.

Signals are sent once the command shows it is in the middle of its work (a line it prints), never after a
fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from helpers.paths import REPO

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    e.update(GPUWARDEN_STATE_DIR=str(tmp_path / "s"), GPUWARDEN_BACKEND="sim")
    assert gw(e, "sim", "init", "--gpus", "2").returncode == 0
    return e


def gw(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def interrupted(env, args: list[str], marker: str, sig: signal.Signals) -> tuple[int, str]:
    """Start the command, wait until it prints `marker`, send `sig`; its exit code and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", *args], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                break
        else:
            raise AssertionError(f"{args} ended without printing {marker!r}: {proc.wait()} {proc.stderr.read()}")
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        return code, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_0_healthy_1_attention_2_error(env):
    assert gw(env, "status").returncode == 0
    assert gw(env, "sim", "leak", "--gpu", "1", "--size", "1GiB").returncode == 0
    attention = gw(env, "status")
    assert attention.returncode == 1
    # The verdict says which problem it means (it said only "NEEDS ATTENTION": issue 36).
    assert attention.stdout.splitlines()[-1] == ("status: NEEDS ATTENTION: GPU 1: 1.0 GiB residual VRAM no "
                                                 "process owns"), attention.stdout
    bad = gw(env, "drain", "7", "--yes")
    assert bad.returncode == 2 and bad.stderr.startswith("gpuwarden: error:") and "Traceback" not in bad.stderr


def test_3_no_agent(env):
    assert gw(env, "agent", "status").returncode == 3


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_work_interrupted_is_130_143_129(env, sig, code):
    hold = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", "sim", "hold", "--gpu", "0", "--size",
                             "1GiB"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert hold.stdout is not None and "holding" in hold.stdout.readline()  # the tenant holds GPU 0 now
        got, err = interrupted(env, ["drain", "0", "--yes", "--timeout", "60"], "→ wait up to", sig)
        assert got == code, err
        assert "Traceback" not in err
    finally:
        hold.terminate()
        hold.wait()


@pytest.mark.parametrize("leak", [False, True])
def test_status_watch_ends_on_ctrl_c_with_the_last_views_code(env, leak):
    # Ctrl-C is how a watch ends, not an interruption of work: the exit code is what the last view showed.
    if leak:
        assert gw(env, "sim", "leak", "--gpu", "1", "--size", "1GiB").returncode == 0
    got, err = interrupted(env, ["status", "--watch", "--interval", "0.5"], "status:", signal.SIGINT)
    assert got == (1 if leak else 0), err
