"""/v1/snapshot's answer made once per snapshot and written as it is: the served JSON is always the latest
snapshot's (never a cached one after a newer refresh), and a gathered send delivers every byte to a slow reader."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading

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


def test_the_served_answer_follows_every_refresh(state_dir):
    node = SimNode(state_dir)
    node.init(gpus=2, vram=8 << 30)
    settings = Settings(state_dir=state_dir, backend="sim")
    sampler = Sampler(settings, deep_every_s=1e9)
    agent = Agent(settings, AgentConfig(), sampler=sampler, log_stream=open(os.devnull, "w"))
    agent.history = History(agent.dir, 1.0)
    agent.events = EventLog(agent.dir, 1000)
    procs = []
    try:
        agent._deliver(sampler.snapshot(deep=True))
        for i in range(4):
            # A client polls (the answer for the latest snapshot is made and kept) ...
            before = _served(agent)
            assert before["taken_at"] == agent.latest().snapshot.taken_at
            assert _served(agent) == before  # asked again before a refresh: the same answer
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
