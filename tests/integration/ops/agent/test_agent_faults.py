"""The agent under the faults of a long night: a full state dir, the wall clock stepped back, the agent stopped
(SIGSTOP) under its clients. (A state dir turned read-only is tests/integration/ops/agent/test_agent_readonly.py: an ext4 that errors
to read-only; tmpfs refuses a read-only remount while the agent holds files open.) It keeps sampling and serving, says what fails in one line
a sink, loses nothing it had written, and no client hangs.

The state dir sits on a small tmpfs this test mounts (CI runs as root, as the agent does on a node)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.agentnode import start_agent
from helpers.cli import gpuwarden
from gpuwarden.ops.agent.client import get
from gpuwarden.ops.agent.history import History
from gpuwarden.ops.agent.writewatch import WriteWatch
from helpers.simnode import wait_for
from helpers.agent_faults import snapshot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting the small tmpfs needs root (CI runs as root)")


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 4 MiB tmpfs: room for a sim node and an agent, and quick to fill."""
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path) -> Path:
    """Take every free byte of the file system; the filler's path."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_a_full_state_dir_costs_one_line_and_no_written_event(small_fs):
    state = small_fs / "state"
    assert gpuwarden("--state-dir", str(state), "sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    agent = start_agent(state)
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="a healthy agent")
        events = state / "agent" / "events.jsonl"
        filler = fill(small_fs)

        def failing() -> bool:
            # Each reload is an event the log must write; the file's last page may still take a few.
            agent.proc.send_signal(signal.SIGHUP)
            return "event log" in agent.json("/healthz")["writes_failing"]
        wait_for(failing, poll=0.1, what="the failing sink named")
        written = events.read_bytes()
        def reloads() -> int:
            return len([e for e in agent.json("/v1/events")["events"] if "reloaded" in e["text"]])
        for _ in range(3):  # one at a time: signals that arrive together are one reload
            n = reloads()
            agent.proc.send_signal(signal.SIGHUP)
            wait_for(lambda n=n: reloads() > n, what="the reload's event, in memory")
        before = agent.json("/v1/snapshot")["taken_at"]
        wait_for(lambda: agent.json("/v1/snapshot")["taken_at"] > before, what="sampling going on")
        assert agent.json("/healthz")["ok"] is True
        assert len(lines_with(agent.log_text(), "event log: writing")) == 1, agent.log_text()
        assert "No space left on device" in agent.log_text()
        assert events.read_bytes() == written  # nothing half-written, nothing already written lost

        filler.unlink()
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "event log: writing works again" in agent.log_text(), what="the recovery said")
        # (the minute trend writes once a minute: it may still be listed until its next write)
        wait_for(lambda: "event log" not in agent.json("/healthz")["writes_failing"], what="the event log healthy")
        after = events.read_bytes()
        assert after.startswith(written)
        assert all(json.loads(line) for line in after.splitlines())  # every line whole
    finally:
        assert agent.stop() == 0


def test_history_on_a_full_disk_says_so_once_and_recovers(small_fs):
    said: list[str] = []
    history = History(small_fs / "agent", 1.0, watch=WriteWatch(lambda level, text: said.append(text)))
    t0 = 1_800_000_000.0  # a minute boundary: each add below closes the minute before it
    history.add(snapshot(t0, 1))
    trend = small_fs / "agent" / "trend.jsonl"
    history.add(snapshot(t0 + 60, 2))
    assert trend.read_bytes().count(b"\n") == 1
    filler = fill(small_fs)
    k = 1
    while not said and k < 500:  # the file's last page may still take a few lines
        k += 1
        history.add(snapshot(t0 + 60 * k, k))
    kept = trend.read_bytes()
    for later in range(k + 1, k + 4):
        history.add(snapshot(t0 + 60 * later, later))
    k = later
    assert len([s for s in said if s.startswith("history: writing")]) == 1, said
    assert trend.read_bytes() == kept
    filler.unlink()
    history.add(snapshot(t0 + 60 * (k + 1), k + 1))
    assert said[-1] == "history: writing works again"
    assert all(json.loads(line) for line in trend.read_bytes().splitlines())
    assert history.series(0, resolution="minute")["minute"]["points"] == k + 2  # those the disk missed, in memory
    history.close()


def test_the_clock_stepped_back_an_hour_keeps_history_ordered(tmp_path):
    history = History(tmp_path / "agent", 1.0)
    t0 = time.time()
    for k in range(5):
        assert history.add(snapshot(t0 + k, k)) == 0.0
    stepped = history.add(snapshot(t0 + 5 - 3600, 5))
    assert 3590 < stepped < 3610
    for k in range(6, 10):
        history.add(snapshot(t0 + k - 3600, k))
    ts = history.series(0, resolution="fine")["fine"]["t"]
    assert len(ts) == 10 and all(b > a for a, b in zip(ts, ts[1:])), ts
    assert all(0 < b - a < 2 for a, b in zip(ts, ts[1:]))  # no negative and no hour-long gap
    history.close()


def test_a_stopped_agent_leaves_no_client_hanging(tmp_path, cli, state_dir):
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    agent = start_agent(state_dir)
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="a healthy agent")
        agent.proc.send_signal(signal.SIGSTOP)
        t = time.monotonic()
        assert get(state_dir / "agent.sock", "/healthz", timeout=1.0) is None  # a timeout, not a hang
        assert time.monotonic() - t < 5
        t = time.monotonic()
        proc = cli("--backend", "sim", "status", "--json", timeout=30)
        assert proc.returncode in (0, 1), proc.stderr
        assert json.loads(proc.stdout)["gpus"]  # sampled here when the agent does not answer
        assert time.monotonic() - t < 15
        agent.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: get(state_dir / "agent.sock", "/healthz", timeout=1.0) is not None, what="answering again")
        wait_for(lambda: agent.json("/healthz")["ok"], what="fresh snapshots again")
    finally:
        agent.proc.send_signal(signal.SIGCONT)
        assert agent.stop() == 0
