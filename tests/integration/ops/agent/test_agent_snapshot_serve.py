"""/v1/snapshot's answer made once per snapshot and written as it is: the served JSON is always the latest
snapshot's (never a cached one after a newer refresh), and a gathered send delivers every byte to a slow reader."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

from gpuwarden.ops.agent.events import EventLog
from gpuwarden.ops.agent.history import History
from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.sampling.sampler import Sampler
from gpuwarden.ops.services.agent_api import send_gathered
from gpuwarden.ops.services.agent_daemon import Agent

MiB = 1 << 20


def _served(agent: Agent) -> dict:
    got = agent.snapshot_document()
    assert got is not None
    parts = got[0]
    return json.loads(b"".join(parts))


def _agent(state_dir) -> tuple[SimNode, Sampler, Agent]:
    """An agent on a two-GPU sim node, fed by hand (no threads): _deliver is the sampling thread's hand-over."""
    node = SimNode(state_dir)
    node.init(gpus=2, vram=8 << 30)
    settings = Settings(state_dir=state_dir, backend="sim")
    sampler = Sampler(settings, deep_every_s=1e9)
    agent = Agent(settings, AgentConfig(), sampler=sampler, log_stream=open(os.devnull, "w"))
    agent.history = History(agent.dir, 1.0)
    agent.events = EventLog(agent.dir, 1000)
    return node, sampler, agent


def test_the_served_answer_follows_every_refresh(state_dir):
    node, sampler, agent = _agent(state_dir)
    procs = []
    try:
        agent._deliver(sampler.snapshot(deep=True))
        for i in range(4):
            # A client polls (the answer for the latest snapshot is made and kept) ...
            before = _served(agent)
            assert before["taken_at"] == agent.latest().snapshot.taken_at
            # Asked again before a refresh: the same answer. The agent block is made per request (its age_s is the
            # snapshot's age at that moment, in ms, so it can tick between the two asks).
            again = _served(agent)
            assert {k: v for k, v in again.items() if k != "agent"} == {k: v for k, v in before.items() if k != "agent"}
            assert {k: v for k, v in again["agent"].items() if k != "age_s"} == \
                {k: v for k, v in before["agent"].items() if k != "age_s"}
            # ... the node changes: a new GPU process ...
            p = subprocess.Popen(["sleep", "60"])
            procs.append(p)
            node.allocate(p.pid, i % 2, (i + 1) * 64 * MiB)
            # ... and the next refresh's answer is the one served (made in the sampling thread, before publishing).
            snap = sampler.snapshot()
            agent._deliver(snap)
            after = _served(agent)
            assert after["taken_at"] == snap.taken_at > before["taken_at"]
            pids = {q["pid"] for q in after["processes"]}
            assert p.pid in pids and len(pids) == i + 1
            assert after["agent"]["stale"] is False and after["agent"]["pid"] == os.getpid()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        sampler.close()
        agent.history.close()
        agent.events.close()


def test_one_read_makes_one_answer_ahead_not_one_every_refresh_after(state_dir, monkeypatch):
    # The answer is made ahead, in the sampling thread, for the refresh after one a client asked for. Before the
    # seventh session of issue 38 an answer made ahead counted as asked for, so one read made every later refresh
    # render its whole snapshot to JSON.
    _, sampler, agent = _agent(state_dir)
    made = []
    render = Agent._render
    monkeypatch.setattr(Agent, "_render", staticmethod(lambda snap: made.append(snap) or render(snap)))
    try:
        agent._deliver(sampler.snapshot(deep=True))
        for _ in range(3):
            agent._deliver(sampler.snapshot())
        assert made == []  # nobody asked: nothing made
        _served(agent)  # one read: the answer for the latest snapshot, made at the request
        assert len(made) == 1
        first = sampler.snapshot()
        agent._deliver(first)
        assert made[-1] is first  # made ahead for the refresh after the read
        for _ in range(4):
            agent._deliver(sampler.snapshot())
        assert len(made) == 2  # and no more: the answer made ahead was never asked for
        assert _served(agent)["taken_at"] == agent.latest().snapshot.taken_at  # a later read is still current
        polled = sampler.snapshot()
        agent._deliver(polled)
        assert made[-1] is polled and len(made) == 4  # a client that keeps asking keeps its answer made ahead
    finally:
        sampler.close()
        agent.history.close()
        agent.events.close()


def test_a_gathered_send_reaches_a_slow_reader_whole():
    """More than the socket buffer can take at once (9 MiB past a default wmem_max of 4 MiB, doubled): partial
    sends continue where they stopped."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parts = (b"HTTP/1.1 200 OK\r\n\r\n", os.urandom(9 * MiB + 17), b"", os.urandom(1000), b"}")
    got = bytearray()

    def read_slowly() -> None:
        while True:
            chunk = b.recv(64 * 1024)
            if not chunk:
                return
            got.extend(chunk)
    try:
        a.settimeout(5.0)  # as the API's handler sockets are (non-blocking underneath: partial sends happen)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        reader = threading.Thread(target=read_slowly)
        reader.start()
        send_gathered(a, parts)
        a.shutdown(socket.SHUT_WR)
        reader.join(10)
        assert bytes(got) == b"".join(parts)
    finally:
        a.close()
        b.close()


class _BigAgent:
    """What the API reads of an agent (api.Served): a snapshot document of `size` bytes in two parts."""

    stopping = False
    metrics = None
    events = None
    history = None

    def __init__(self, size: int):
        self.doc = (b'{"pad":"' + b"x" * size + b'"', b',"agent":{}}')
        self.asked = 0

    def health(self):
        return {"ok": True}

    def snapshot_document(self):
        self.asked += 1
        return self.doc, False, False

    def backend_name(self):
        return "fake"

    def log(self, level, text):
        pass


def _serve(agent, tmp_path):
    from gpuwarden.ops.services.agent_api import Access, ApiServer
    server = ApiServer(tmp_path / "api.sock", agent, Access(None))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, thread


def test_a_plain_snapshot_request_is_answered_whole_without_a_handler_thread(tmp_path, monkeypatch):
    """Requests already whole when accepted (the server starts after they are sent): each answered in the
    accepting thread; one whose head is not a plain GET /v1/snapshot goes to a handler thread, as before."""
    import socketserver

    from gpuwarden.ops.services.agent_api import Access, ApiServer
    handled: list[object] = []
    real = socketserver.ThreadingMixIn.process_request
    monkeypatch.setattr(socketserver.ThreadingMixIn, "process_request",
                        lambda self, request, addr: (handled.append(request), real(self, request, addr))[1])
    agent = _BigAgent(1 << 20)
    server = ApiServer(tmp_path / "api.sock", agent, Access(None))
    clients = []
    try:
        for target in ["/v1/snapshot"] * 5 + ["/v1/snapshot?x=1"]:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(tmp_path / "api.sock"))
            c.sendall(f"GET {target} HTTP/1.1\r\nHost: agent\r\n\r\n".encode())
            c.settimeout(10)
            clients.append(c)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        answers = []
        for c in clients:
            got = bytearray()
            while chunk := c.recv(1 << 20):
                got.extend(chunk)
                if b"\r\n\r\n" in got and got.startswith(b"HTTP/1.1 400"):
                    break  # the handler keeps that connection open for a next request
            answers.append(bytes(got).partition(b"\r\n\r\n"))
        for head, _, body in answers[:5]:
            assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in head
            assert b"X-Gpuwarden-Backend: fake" in head and body == b"".join(agent.doc)
        assert answers[5][0].startswith(b"HTTP/1.1 400")
        assert len(handled) == 1  # the 400 alone went to a handler thread
    finally:
        for c in clients:
            c.close()
        server.shutdown()
        server.server_close()


def test_an_answer_larger_than_the_buffer_is_finished_for_a_client_that_reads_late(tmp_path):
    agent = _BigAgent(12 << 20)  # past what a grown send buffer takes (2 x wmem_max, 4 MiB by default)
    server, thread = _serve(agent, tmp_path)
    try:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(str(tmp_path / "api.sock"))
        c.sendall(b"GET /v1/snapshot HTTP/1.1\r\nHost: agent\r\n\r\n")
        deadline = time.monotonic() + 5
        while agent.asked == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the answer is being written before this client reads a byte
        c.settimeout(5)
        got = bytearray()
        while chunk := c.recv(1 << 20):
            got.extend(chunk)
        c.close()
        head, _, body = bytes(got).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"".join(agent.doc)
    finally:
        server.shutdown()
        server.server_close()
