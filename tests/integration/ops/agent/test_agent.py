"""The node agent end to end: a real `gpuwarden agent` on the simulated node, its sd_notify handshake, API,
events, history, signals, and `status` through it.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest

from helpers.agentnode import snapshot_of, start_agent
from helpers.simnode import kill_and_wait_zombie, start_careless_parent, start_tenant, wait_for

from gpuwarden.ops.foundation import jsondoc

GiB = 1 << 30


# The sim node these tests run on (conftest.py's sim_state fixture reads it).
SIM_NODE = {"gpus": 4, "vram": "24GiB"}


@pytest.fixture
def agent(sim_state):
    a = start_agent(sim_state)
    yield a
    a.stop()


def test_ready_healthz_snapshot_and_status_via_the_agent(agent, cli, sim_state):
    assert f"MAINPID={agent.proc.pid}" in agent.ready_message
    health = wait_for(lambda: (h := agent.json("/healthz"))["ok"] and h, what="a healthy agent")
    jsondoc.validate(health)
    assert health["backend"] == "sim" and health["pid"] == agent.proc.pid
    from gpuwarden.ops import __version__  # one version: --version, the wheel and the image tag carry it too
    assert health["version"] == __version__ and cli("--version").stdout.split()[-1] == __version__
    mode = stat.S_IMODE(os.stat(agent.sock).st_mode)
    assert stat.S_ISSOCK(os.stat(agent.sock).st_mode) and mode == 0o660
    snap = snapshot_of(agent)
    jsondoc.validate(snap)
    assert snap["agent"]["pid"] == agent.proc.pid and snap["agent"]["stale"] is False
    proc = cli("--backend", "sim", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert doc["agent"]["pid"] == agent.proc.pid  # served by the agent, not sampled here
    text = cli("--backend", "sim", "status")
    assert "via agent" in text.stdout.splitlines()[0] and text.returncode == 0


def test_residual_shows_in_events_history_and_status_exit_code(agent, cli, sim_state):
    parent, child = start_careless_parent(sim_state, 2, "3GiB")
    try:
        kill_and_wait_zombie(child)
        # GPU 2's own event: another test's tenant dying on this module's node may leave its GPU a residual briefly.
        events = wait_for(lambda: [e for e in agent.json("/v1/events")["events"]
                                   if e["kind"] == "residual-appeared" and e["gpu"] == 2],
                          what="GPU 2's residual-appeared event")
        assert "3.0 GiB" in events[0]["text"]
        jsondoc.validate(agent.json("/v1/events"))
        assert cli("--backend", "sim", "status", "--json").returncode == 1  # needs attention, via the agent
        hist = agent.json("/v1/history?gpu=2&since=10m&events=1")
        jsondoc.validate(hist)
        fine = hist["gpus"]["2"]["fine"]
        assert fine["points"] == len(fine["t"]) and max(fine["residual"]) == 3 * GiB
        assert any(e["kind"] == "residual-appeared" for e in hist["events"])
    finally:
        parent.kill()
        parent.wait()
    cleared = wait_for(lambda: [e for e in agent.json("/v1/events?since=10m")["events"]
                                if e["kind"] == "residual-cleared" and e["gpu"] == 2], what="GPU 2's residual cleared")
    assert "after" in cleared[0]["text"]
    proc = cli("history", "2", "--since", "10m")
    assert proc.returncode == 0 and "residual VRAM 3.0 GiB appeared" in proc.stdout
    out = cli("history", "--json")
    jsondoc.validate(json.loads(out.stdout))


def test_sigterm_stops_within_two_seconds_and_the_history_stays(sim_state, cli):
    agent = start_agent(sim_state)
    wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
    t0 = time.monotonic()
    assert agent.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 2.0, agent.log_text()
    assert not agent.sock.exists()
    assert "Traceback" not in agent.log_text()
    # Without an agent, status samples itself again and history reads the files it left.
    assert cli("--backend", "sim", "status", "--json").returncode == 0
    out = cli("history", "--json")
    assert out.returncode == 0, out.stderr
    assert [e["text"] for e in json.loads(out.stdout)["events"]][-1] == "agent stopped"


def test_a_second_agent_and_the_sim_fallback_are_refused(agent, cli, sim_state):
    proc = cli("--backend", "sim", "agent", "--foreground")
    assert proc.returncode == 2 and "another agent answers" in proc.stderr or "already runs" in proc.stderr
    auto = cli("agent", "--foreground", env={"GPUWARDEN_BACKEND": ""})
    if os.path.exists("/sys/class/kfd") or os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has a GPU driver")
    assert auto.returncode == 2 and "no GPU backend works here" in auto.stderr and "Traceback" not in auto.stderr


def test_sighup_reloads_the_config_and_a_broken_one_is_refused(sim_state, tmp_path):
    conf = tmp_path / "node.toml"
    conf.write_text("[agent]\ninterval = 0.25\n")
    agent = start_agent(sim_state, "--config", str(conf))
    try:
        conf.write_text("[agent]\ninterval = 0.5\nbundle_on = [\"crash\"]\n")
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: agent.json("/healthz")["interval_s"] == 0.5, what="the new interval")
        conf.write_text("[agent]\ninterval = \"soon\"\n")
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in agent.log_text(), what="the refusal in the log")
        assert agent.json("/healthz")["interval_s"] == 0.5
    finally:
        assert agent.stop() == 0


def test_events_stream_follows_new_events(agent, sim_state):
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(agent.sock))
    s.sendall(b"GET /v1/events?follow=1 HTTP/1.1\r\nHost: a\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    assert buf.startswith(b"HTTP/1.1 200") and b"application/x-ndjson" in buf
    tenant = start_tenant(sim_state, 1, "1GiB")
    try:
        os.kill(tenant.pid, signal.SIGKILL)
        tenant.wait()
        # A killed tenant's allocation goes with it: no residual; the leak drill leaves one.
    finally:
        pass
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(sim_state).leak(3, 2 * GiB)
    body = buf.split(b"\r\n\r\n", 1)[1]

    def events() -> list[dict]:  # the complete lines so far (the last may still be arriving)
        return [json.loads(x) for x in body.split(b"\n")[:-1] if x.strip()]

    def leak_seen() -> bool:
        return any(e["kind"] == "residual-appeared" and e["gpu"] == 3 for e in events())
    # Until GPU 3's event itself: the killed tenant can leave GPU 1 a residual for one sample (the agent may look
    # between the kill and the sim freeing the allocation), whose event named GPU 1 and ended the wait too early.
    deadline = time.monotonic() + 60  # a loaded box (two xdist workers): 20 s was missed once
    while not leak_seen() and time.monotonic() < deadline:
        chunk = s.recv(65536)
        assert chunk, "the agent closed the event stream"
        body += chunk
    s.close()
    lines = events()
    assert leak_seen(), lines
    for e in lines:
        jsondoc.validate(e)


def test_the_console_reads_the_agent_and_backfills_its_sparklines(sim_state):
    import asyncio

    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    from helpers.tui_support import screen_text
    from helpers.tui_support import wait_for as pilot_wait
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.ops.sources import viewer_source

    agent = start_agent(sim_state)
    try:
        SimNode(sim_state).leak(1, 6 * GiB)
        def fine():
            return agent.json("/v1/history?gpu=1&resolution=fine")["gpus"].get("1", {}).get("fine") or {}
        wait_for(lambda: fine().get("points", 0) > 2 and max(fine()["used"]) > 0,
                 what="history before the console opens")
        settings = Settings(state_dir=sim_state, backend="sim", config_path=sim_state / "node.toml")
        source, close = viewer_source(settings)

        async def go():
            app = GpuwardenApp(settings, source=source, on_exit=close, refresh_s=0.25, read_only=True)
            async with app.run_test(size=(160, 40)) as pilot:
                await pilot_wait(pilot, lambda: app.snapshot is not None, what="first snapshot")
                await pilot_wait(pilot, lambda: "via agent" in screen_text(app), what="the header")
                # Events the agent saw before this console opened are in the panel.
                await pilot_wait(pilot, lambda: "agent started" in screen_text(app), what="backfilled events")
                assert app.history.series(1) and max(app.history.series(1)) > 0.2
        asyncio.run(go())
        assert source.via_agent
    finally:
        agent.stop()
