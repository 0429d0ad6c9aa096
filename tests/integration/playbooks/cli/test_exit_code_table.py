"""The exit-status table of `gpuwarden --help`, claim by claim, on the simulated node with real processes and
real signals (issue 36: Ctrl-C on `status --watch` disagreed with it, and SIGTERM on a watch said 0, healthy)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO
from helpers.cli import gpuwarden

pytestmark = pytest.mark.timeout(120)


def table() -> str:
    out = gpuwarden("--help", env={"COLUMNS": "200"}).stdout
    return " ".join(out[out.index("Exit status:"):out.index("Options:")].split())


def test_the_table_names_these_codes():
    codes = {int(c) for c in re.findall(r"\b(\d{1,3})\b", table())}
    assert codes == {0, 1, 2, 130, 143, 129}, table()
    assert "`status --watch` and `journal --follow` end" in table() and "last view's 0 or 1" in table()
    assert "(`sim hold`) ends on any of those signals with 0" in table()


def test_0_healthy_1_needs_attention_1_refused_2_error(sim_cli):
    assert "0 done or healthy" in table() and "1 needs attention, refused" in table() and "2 error" in table()
    assert sim_cli("status").returncode == 0
    assert sim_cli("sim", "leak", "--gpu", "1", "--size", "1GiB").returncode == 0
    assert sim_cli("status").returncode == 1
    refused = sim_cli("drain", "0")  # stdin is no terminal and no --yes
    assert refused.returncode == 1 and "pass --yes" in refused.stderr
    assert sim_cli("status", "--bundle", "/nonexistent/b.tar.gz").returncode == 2  # a missing file
    assert sim_cli("sim", "hold", "--gpu", "0", "--size", "0GiB").returncode == 2  # bad input


def _start(state_dir: Path, *args: str) -> subprocess.Popen:
    # SIGINT at its default in the child, as in a terminal (a background job would inherit it ignored).
    # -X faulthandler: a child that does not end after its signal is made to print where every thread is (SIGABRT).
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir),
                             "--backend", "sim", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _exit_code(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """The child's exit status; one still running after `timeout` fails the test with every thread's stack."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"still running {timeout:g} s after its signal; where it was:\n{err}") from None


def _wait_for_output(proc: subprocess.Popen, needle: str, timeout: float = 30.0) -> None:
    import os
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        assert time.monotonic() < deadline, f"{needle!r} never printed: {seen[-500:]!r}"
        if sel.select(0.2):
            chunk = os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
            assert chunk, f"exited before {needle!r}: {proc.wait()} {proc.stderr.read()}"
            seen += chunk


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "SIGTERM"),
                                          (signal.SIGHUP, 129, "SIGHUP")])
def test_an_interrupted_command_exits_128_plus_the_signal(sim_cli, sim_state, sig, code, word):
    # A drain waiting for a tenant that keeps holding its GPU, interrupted mid-wait.
    assert f"{code}" in table()
    tenant = _start(sim_state, "sim", "hold", "--gpu", "0", "--size", "1GiB")
    try:
        _wait_for_output(tenant, "holding")
        proc = _start(sim_state, "drain", "0", "--yes", "--timeout", "60")
        _wait_for_output(proc, "→ wait")
        proc.send_signal(sig)
        assert _exit_code(proc) == code
        assert word in proc.stderr.read()
    finally:
        tenant.terminate()
        tenant.wait(30)
        sim_cli("undrain", "0", "--yes")


def test_ctrl_c_ends_a_watch_with_its_last_views_code_and_sigterm_does_not(sim_cli, sim_state):
    sim_cli("sim", "leak", "--gpu", "1", "--size", "1GiB")  # the view: needs attention, 1
    for sig, code in ((signal.SIGINT, 1), (signal.SIGTERM, 143), (signal.SIGHUP, 129)):
        proc = _start(sim_state, "status", "--watch", "--interval", "0.25")
        _wait_for_output(proc, "status: NEEDS ATTENTION")
        proc.send_signal(sig)
        assert proc.wait(30) == code, (sig, proc.stderr.read())


def test_ctrl_c_ends_a_journal_follow_with_0_and_sigterm_does_not(sim_cli, sim_state, tmp_path):
    made = sim_cli("arena", "create", str(tmp_path / "w.arena"), "--size", "4MiB", "--chunk-size", "1MiB", "-q")
    assert made.returncode == 0, made.stderr  # a journal line for the follow to print first
    for sig, code in ((signal.SIGINT, 0), (signal.SIGTERM, 143)):
        proc = _start(sim_state, "journal", "--follow")
        _wait_for_output(proc, "arena create")
        proc.send_signal(sig)
        assert proc.wait(30) == code, (sig, proc.stderr.read())


def test_a_simulated_tenant_ends_on_a_signal_with_0(sim_state):
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        proc = _start(sim_state, "sim", "hold", "--gpu", "0", "--size", "1GiB")
        _wait_for_output(proc, "holding")
        proc.send_signal(sig)
        assert proc.wait(30) == 0, (sig, proc.stderr.read())
