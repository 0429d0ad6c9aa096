"""The chooser's rules (ops/sources/choose.py): which source status, --watch, the console, metrics and history get
from a real unix socket that answers as an agent would (up, down, stale, refusing, another backend), a bundle,
a captured tree and a node with no GPU backend at all.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from gpuwarden.ops.agent import client
from gpuwarden.ops.config import loader
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.backends.select import BackendUnavailable, open_backend
from gpuwarden.ops.sources import choose as ch
from gpuwarden.ops.sources.kinds import AgentSource, ConsoleSource, LocalSource

SIM_NODE = {"gpus": 2}


class FakeAgent:
    """A unix socket at <state dir>/agent.sock that answers every request with `status`, `headers` and `body`,
    as the agent's HTTP API does (one request a connection, then close)."""

    def __init__(self, state_dir: Path, body: bytes, *, status: int = 200, headers: dict[str, str] | None = None):
        self.path = state_dir / "agent.sock"
        self.status, self.body = status, body
        self.headers = {"x-gpuwarden-backend": "sim", **(headers or {})}
        self.requests: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed by stop()
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        break
                    request += data
                self.requests.append(request.split(b" ")[1].decode())
                head = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
                conn.sendall(f"HTTP/1.1 {self.status} X\r\n{head}Content-Length: {len(self.body)}\r\n\r\n".encode()
                             + self.body)

    def stop(self) -> None:
        """Nobody listens any more; the socket file stays, as after an agent killed with SIGKILL."""
        if self.sock.fileno() < 0:
            return  # stopped already (by the test, before the fixture's teardown)
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() in _serve
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def body(sim_settings: Settings) -> bytes:
    """A snapshot document as the agent serves it (of the same sim node, marked as the agent's)."""
    from dataclasses import replace

    from gpuwarden.ops.sampling.sampler import take_snapshot
    snap = take_snapshot(sim_settings)
    return replace(snap, agent={"pid": 1, "stale": False}).to_json().encode()


@pytest.fixture
def agent(sim_settings: Settings, body: bytes):
    fake = FakeAgent(sim_settings.state_dir, body)
    yield fake
    fake.stop()


def test_an_answering_agent_is_the_source_and_names_its_socket(sim_settings, agent, body):
    source = ch.choose(sim_settings, ch.ONCE)
    assert isinstance(source, AgentSource) and source.kind == ch.AGENT
    assert source.describe() == f"agent at {sim_settings.state_dir / 'agent.sock'}"
    assert source.reply.body == body and source.warnings == ()
    assert source.snapshot().agent == {"pid": 1, "stale": False}
    raw = ch.raw(sim_settings)
    assert raw is not None and raw.body == body and ch.reply_exit_code(raw) == 0


@pytest.mark.parametrize("header", ["x-gpuwarden-stale", "x-gpuwarden-needs-attention"])
def test_a_stale_or_troubled_agent_still_answers_and_status_exits_1(sim_settings, body, header):
    fake = FakeAgent(sim_settings.state_dir, body, headers={header: "1"})
    try:
        reply = ch.raw(sim_settings)
        assert reply is not None and ch.reply_exit_code(reply) == 1
        assert ch.choose(sim_settings, ch.ONCE).kind == ch.AGENT
    finally:
        fake.stop()


def test_no_agent_no_socket_samples_here(sim_settings):
    assert not (sim_settings.state_dir / "agent.sock").exists()
    assert ch.raw(sim_settings) is None
    source = ch.choose(sim_settings, ch.ONCE)
    try:
        assert isinstance(source, LocalSource) and source.kind == ch.LOCAL
        assert source.describe() == "local sim" and source.snapshot(deep=True).agent is None
        assert source.sampler.attribution is not None
    finally:
        source.close()


def test_a_socket_nobody_listens_on_samples_here(sim_settings, agent):
    agent.stop()
    assert agent.path.exists()
    assert ch.raw(sim_settings) is None
    source = ch.choose(sim_settings, ch.ONCE)
    source.close()
    assert source.kind == ch.LOCAL


def test_an_agent_that_refuses_samples_here(sim_settings, body):
    fake = FakeAgent(sim_settings.state_dir, b'{"error":"starting"}', status=503)
    try:
        assert ch.raw(sim_settings) is None
        source = ch.choose(sim_settings, ch.ONCE)
        source.close()
        assert source.kind == ch.LOCAL and fake.requests == ["/v1/snapshot", "/v1/snapshot"]
    finally:
        fake.stop()


def test_a_named_backend_the_agent_does_not_sample_is_sampled_here(sim_settings, body):
    fake = FakeAgent(sim_settings.state_dir, body, headers={"x-gpuwarden-backend": "sysfs"})
    try:
        assert ch.agent_reply(sim_settings) is None  # --backend sim; the agent reads sysfs
        assert ch.agent_reply(sim_settings.with_(backend=None)) is not None  # no backend named: the agent's
        assert ch.agent_reply(sim_settings.with_(backend="sysfs")) is not None
    finally:
        fake.stop()


def test_a_captured_tree_asks_no_agent_but_history_does(sim_settings, agent, tmp_path):
    (tmp_path / "sys").mkdir()
    captured = sim_settings.with_(sysfs_root=tmp_path / "sys")
    assert captured.captured
    assert ch.agent_reply(captured) is None and ch.raw(captured) is None
    assert ch.agent_reply(captured, ch.METRICS, "/metrics") is None
    assert agent.requests == []  # not even asked
    reply = ch.agent_reply(captured, ch.HISTORY, "/v1/history?since=0")
    assert reply is not None and agent.requests == ["/v1/history?since=0"]
    with pytest.raises(ValueError):
        ch.choose(captured, ch.HISTORY)


def test_metrics_asks_the_agent_for_its_exposition(sim_settings, agent):
    source = ch.choose(sim_settings, ch.METRICS, target="/metrics?per_process=1")
    assert isinstance(source, AgentSource) and agent.requests == ["/metrics?per_process=1"]


def test_a_config_of_the_commands_own_is_checked_and_its_problem_is_a_warning(sim_settings, agent, monkeypatch):
    monkeypatch.delenv("GPUWARDEN_CONFIG", raising=False)
    bad = sim_settings.state_dir / "bad.toml"
    bad.write_text("[arena\n")
    own = sim_settings.with_(config_path=bad, cli_words=("--config", str(bad)))
    assert ch.raw(own) is None  # the raw bytes would leave the warning out: the caller takes choose()
    source = ch.choose(own, ch.ONCE)
    [warning] = source.warnings
    assert warning.code == "config-unusable" and warning.message.startswith("node config unusable")
    assert warning.to_dict() == {"code": "config-unusable", "message": warning.message}
    # The same file, not named by this command (the agent's own config): nothing to check, nothing to add.
    assert ch.choose(sim_settings.with_(config_path=bad), ch.ONCE).warnings == ()
    monkeypatch.setenv("GPUWARDEN_CONFIG", str(bad))
    assert ch.raw(sim_settings.with_(config_path=bad)) is None


def test_a_bundle_is_the_source_whatever_answers(sim_settings, agent, tmp_path):
    from gpuwarden.playbooks.bundle import BundlePlaybook
    from gpuwarden.playbooks.framework import run
    bundle = tmp_path / "incident.tar.gz"
    assert run(BundlePlaybook(output=bundle), sim_settings).ok
    agent.requests.clear()
    for want in (ch.ONCE, ch.WATCH, ch.CONSOLE):
        source = ch.choose(sim_settings, want, bundle=bundle)
        assert source.kind == ch.BUNDLE and source.describe() == f"bundle {bundle}"
        assert source().source == f"bundle:{bundle}"
        assert not hasattr(source, "agent_json")  # the console backfills no history from a bundle
    assert agent.requests == []


def test_a_watch_on_an_agent_that_stops_says_so(sim_settings, agent):
    source = ch.choose(sim_settings, ch.WATCH)
    source.snapshot()  # the chooser's own reply
    source.snapshot()  # asked again
    agent.stop()
    with pytest.raises(GpuwardenError, match="the agent stopped answering"):
        source.snapshot()


def test_the_console_goes_on_here_when_its_agent_stops(sim_settings, agent):
    source = ch.choose(sim_settings, ch.CONSOLE)
    try:
        assert isinstance(source, ConsoleSource)
        assert source().agent is not None and source.via_agent and source.kind == ch.AGENT
        assert source.agent_json("/v1/events") is not None
        agent.stop()
        assert source().agent is None and not source.via_agent
        assert source.kind == ch.LOCAL and source.describe() == "local sim"
    finally:
        source.close()


def test_only_the_console_falls_back_to_the_simulated_node(tmp_path, monkeypatch):
    for name in ("GPUWARDEN_BACKEND", "GPUWARDEN_SYSFS_ROOT", "GPUWARDEN_PROC_ROOT", "GPUWARDEN_CONFIG",
                 "GPUWARDEN_HOST_ROOT"):
        monkeypatch.delenv(name, raising=False)
    live = loader.resolve({}, check=False).with_(state_dir=tmp_path / "state")  # this live node: no GPU here or in CI
    try:
        open_backend(live).close()
    except BackendUnavailable:
        pass
    else:
        pytest.skip("a real GPU backend works on this machine")
    for want in (ch.ONCE, ch.WATCH, ch.METRICS):
        with pytest.raises(BackendUnavailable, match="no GPU backend works here"):
            ch.choose(live, want)
    source = ch.choose(live, ch.CONSOLE)
    try:
        assert source.kind == ch.SIMULATED and source.describe().startswith("simulated node (no GPU backend works")
        assert source().simulated
    finally:
        source.close()
    # A backend named by the operator is never swapped for the simulated node, not even in the console.
    with pytest.raises(BackendUnavailable):
        ch.choose(live.with_(backend="sysfs"), ch.CONSOLE)


def test_the_raw_path_loads_only_the_socket_client_and_the_chooser():
    """What `status --json` via the agent pays for the chooser: its module and its package, nothing else."""
    import subprocess
    import sys
    code = ("import sys; before = set(sys.modules); import gpuwarden.ops.sources.choose; "
            "print(sorted(set(sys.modules) - before))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    out = subprocess.run([sys.executable, "-c", "import gpuwarden.ops.agent.client, gpuwarden.playbooks.cli.fastcli; "
                          + code], capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    assert out.strip() == "['gpuwarden.ops.sources', 'gpuwarden.ops.sources.choose']"
    assert client.SNAPSHOT == "/v1/snapshot"


def test_the_console_asks_a_missing_agent_again_only_every_few_seconds(sim_settings, body, monkeypatch):
    """No agent: the console samples here and does not knock on the socket every refresh (issue 38); an agent that
    starts is taken once AGENT_RETRY_S has passed since the last miss."""
    from gpuwarden.ops.sources import kinds
    asked = []
    real = kinds.ConsoleSource._from_agent

    def counting(self):
        asked.append(1)
        return real(self)
    monkeypatch.setattr(kinds.ConsoleSource, "_from_agent", counting)
    source = ch.choose(sim_settings, ch.CONSOLE)
    try:
        assert isinstance(source, ConsoleSource) and not source.via_agent
        for _ in range(3):
            source()
        assert len(asked) == 1  # the chooser's question only
        fake = FakeAgent(sim_settings.state_dir, body)
        try:
            source()
            assert not source.via_agent  # inside the retry window: still sampled here
            source._agent_missed_at -= kinds.AGENT_RETRY_S  # the window has passed
            assert source().agent is not None and source.via_agent and len(asked) == 2
            source()
            assert len(asked) == 3  # with an agent, every refresh is its answer
        finally:
            fake.stop()
    finally:
        source.close()


def test_the_consoles_own_sampler_reads_every_processs_fds_once_a_minute(sim_settings):
    from gpuwarden.ops.sources import kinds
    local = kinds.LocalSource(sim_settings, console=True)
    try:
        assert local.sampler.full_scan_every_s == kinds.CONSOLE_FULL_SCAN_S == 60.0
    finally:
        local.close()
    plain = kinds.LocalSource(sim_settings)
    try:
        assert plain.sampler.full_scan_every_s == 0.0  # status: every deep scan is full
    finally:
        plain.close()
