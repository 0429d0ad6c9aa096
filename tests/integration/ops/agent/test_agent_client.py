"""The agent's wire client (ops/agent/client.py) against real unix sockets whose listen queue is full: it waits
for room up to its timeout instead of taking the agent for absent.

A unix connect to a full queue fails at once with EAGAIN; under a crowd of connections (tests/integration/project/test_harden_slowloris.py)
that made `status` and the consoles sample by themselves beside a running agent.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from gpuwarden.ops.agent import client


@pytest.fixture
def full_queue(tmp_path):
    """A listening socket that accepts nothing yet, its queue filled (backlog 0 holds one connection)."""
    path = tmp_path / "agent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    fillers = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(path))
        except BlockingIOError:
            s.close()
            break
        fillers.append(s)
    yield path, listener, fillers
    for s in fillers:
        s.close()
    listener.close()


def test_a_queue_that_stays_full_is_a_timeout_not_an_absent_agent(full_queue):
    path, _, _ = full_queue
    with pytest.raises(TimeoutError, match="listen queue stayed full"):
        client.connect(path, 0.3)
    assert client.get(path, "/healthz", timeout=0.3) is None


def test_a_queue_that_drains_while_the_client_waits_gets_the_answer(full_queue, monkeypatch):
    path, listener, fillers = full_queue
    waiting = threading.Event()
    real_sleep = time.sleep

    def sleep(s: float) -> None:  # the real pause, and a sign that the client met the full queue
        waiting.set()
        real_sleep(s)
    monkeypatch.setattr(client.time, "sleep", sleep)

    def serve() -> None:
        assert waiting.wait(30), "the client never met the full queue"
        for _ in fillers:
            listener.accept()[0].close()
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    reply = client.get(path, "/healthz", timeout=30)
    server.join(30)
    assert reply is not None and reply.status == 200 and reply.body == b"ok"
