"""`gpuwarden agent start|stop|status|restart` and `--install-systemd`, with real agents on the simulated node.

Every agent here is a real detached process found the way the commands find it: by the flock it holds on
<state dir>/agent/lock and the PID written there.
"""

from __future__ import annotations

import json
import re
import time
import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.cli import gpuwarden
from gpuwarden.ops.agent import running

pytestmark = pytest.mark.timeout(90)


def agent(state_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return gpuwarden("--state-dir", str(state_dir), *args, env=env)


@pytest.fixture
def node(state_dir: Path):
    """A sim node whose agent, whatever a test left running, is stopped (and waited for) at the end."""
    assert agent(state_dir, "--backend", "sim", "sim", "init", "--gpus", "2").returncode == 0
    yield state_dir
    run = running.find(state_dir)
    if run is not None:
        os.kill(run.pid, signal.SIGKILL)
        _wait_gone(run.pid)


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    fd = os.pidfd_open(pid)
    try:
        import select
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(timeout * 1000), f"pid {pid} still runs"
    finally:
        os.close(fd)


def _journal(state_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (state_dir / "journal.log").read_text().splitlines() if line.strip()]


def test_start_status_stop_with_real_processes(node):
    assert agent(node, "agent", "status").returncode == 3  # nothing runs yet

    started = agent(node, "--backend", "sim", "agent", "start", "--interval", "0.5")
    assert started.returncode == 0, started.stderr
    run = running.find(node)
    assert run is not None and f"pid {run.pid}" in started.stdout
    assert "--interval" in run.argv and "start" not in run.argv  # the detached agent runs; it does not start one
    assert run.env.get("GPUWARDEN_BACKEND") is None  # given as an option here, not through the environment

    status = agent(node, "agent", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"running (pid {run.pid})" in status.stdout and "backend sim" in status.stdout

    again = agent(node, "--backend", "sim", "agent", "start")
    assert again.returncode == 0 and f"already running for {node} (pid {run.pid})" in again.stderr
    assert running.find(node).pid == run.pid  # no second agent

    stopped = agent(node, "agent", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped (pid {run.pid}" in stopped.stdout
    assert not Path(f"/proc/{run.pid}").exists() or "zombie" in Path(f"/proc/{run.pid}/status").read_text().lower()
    assert running.find(node) is None
    assert agent(node, "agent", "status").returncode == 3
    assert agent(node, "agent", "stop").stdout.startswith("agent: not running")  # stopping nothing is not an error
    stops = [e for e in _journal(node) if e["action"] == "agent-stop"]
    assert [e["result"] for e in stops] == ["started", "ok"] and stops[0]["agent_pid"] == run.pid


def test_restart_runs_it_again_as_it_ran(node):
    env = {"GPUWARDEN_BACKEND": "sim"}  # through the environment this time: restart must carry it
    assert agent(node, "agent", "start", "--interval", "0.5", env=env).returncode == 0
    first = running.find(node)
    assert first is not None and first.env.get("GPUWARDEN_BACKEND") == "sim"

    changed = agent(node, "agent", "restart", "--interval", "2", env={})
    assert changed.returncode == 2 and "takes no options (--interval)" in changed.stderr
    assert running.find(node).pid == first.pid  # refused before anything was stopped

    restarted = agent(node, "agent", "restart", env={})  # no GPUWARDEN_BACKEND in this shell
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    second = running.find(node)
    assert second is not None and second.pid != first.pid
    words = list(second.argv)
    assert words[words.index("--interval") + 1] == "0.5" and second.env.get("GPUWARDEN_BACKEND") == "sim"
    assert agent(node, "agent", "status").returncode == 0


def test_restart_without_an_agent_starts_one(node):
    result = agent(node, "--backend", "sim", "agent", "restart")
    assert result.returncode == 0, result.stderr
    assert "not running" in result.stderr and running.find(node) is not None


def test_an_agent_that_does_not_answer_is_status_1(node):
    assert agent(node, "--backend", "sim", "agent", "start").returncode == 0
    run = running.find(node)
    os.kill(run.pid, signal.SIGSTOP)  # alive, holding its lock, answering nobody
    try:
        status = agent(node, "agent", "status")
        assert status.returncode == 1 and "does not answer" in status.stdout
    finally:
        os.kill(run.pid, signal.SIGCONT)


def test_wrong_words_are_one_line_exit_2(node):
    bad = agent(node, "agent", "bogus")
    assert bad.returncode == 2 and "unknown agent action 'bogus'" in bad.stderr and "Traceback" not in bad.stderr
    k8s = agent(node, "k8s-agent", "stop")
    assert k8s.returncode == 2 and "k8s-agent takes no action word" in k8s.stderr


def test_an_agent_under_systemd_is_left_to_systemd(monkeypatch):
    cgroup = b"0::/system.slice/gpuwarden-agent.service\n"
    monkeypatch.setattr(running, "_read", lambda path, limit=0: cgroup)
    assert running._unit(1234) == "gpuwarden-agent.service"
    with pytest.raises(running.GpuwardenError) as refused:
        running.refuse_managed(running.Running(1234, unit="gpuwarden-agent.service"), "stop")
    assert refused.value.hint == "systemctl stop gpuwarden-agent"
    cgroup = b"12:name=systemd:/user.slice/user-0.slice/session-3.scope\n0::/user.slice/user-0.slice/session-3.scope\n"
    assert running._unit(1234) is None


def test_install_systemd_dry_run_prints_the_unit_and_yes_writes_it(node, tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    dry = agent(node, "agent", "--install-systemd", "--unit-dir", str(units))
    assert dry.returncode == 0, dry.stderr
    assert "[Service]" in dry.stdout and "Type=notify" in dry.stdout and not any(units.iterdir())
    done = agent(node, "agent", "--install-systemd", "--unit-dir", str(units), "--yes")
    unit = units / "gpuwarden-agent.service"
    assert unit.is_file() and "agent --foreground" in unit.read_text(), done.stdout + done.stderr
    assert oct(unit.stat().st_mode & 0o777) == "0o644"
    assert any(e["action"] == "install-systemd" for e in _journal(node))


def test_the_shipped_unit_is_the_one_install_systemd_writes():
    from helpers.paths import REPO
    from gpuwarden.playbooks.agentinstall import unit_text
    assert (REPO / "deploy/systemd/gpuwarden-agent.service").read_text() == unit_text()


def test_history_of_an_idle_gpu_draws_a_flat_line(node):
    # An idle GPU's bars were drawn as `||` (issue 36): a series with nothing above zero now says so in words.
    assert agent(node, "--backend", "sim", "agent", "start", "--interval", "0.25").returncode == 0
    deadline = time.monotonic() + 30
    while True:  # until the agent's history holds a few refreshes
        shown = agent(node, "--backend", "sim", "history", "1")
        points = re.search(r"GPU 1 \(\w+, (\d+) points\)", shown.stdout)
        if points and int(points.group(1)) >= 3:
            break
        assert time.monotonic() < deadline, shown.stdout + shown.stderr
    assert "||" not in shown.stdout, shown.stdout
    assert re.search(r"^\s+residual 0 B throughout \(\d+ points\)$", shown.stdout, re.M), shown.stdout
