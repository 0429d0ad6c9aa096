"""A slowloris crowd (connections that send one header line a second and never finish their request) against a
real agent: its API still answers /healthz and its metrics listener still answers scrapes while the crowd is on.

Real agent process, real unix and TCP sockets; the crowd reconnects what the agent drops, as an attacker would.
"""

from __future__ import annotations

import socket
import threading
import time

from helpers.agentnode import start_agent
from helpers.simnode import wait_for

from gpuwarden.ops.agent.client import get
from helpers.harden_slowloris import metrics_port


class Crowd:
    """`count` connections, each sending a request line and then one header line per second, forever."""

    def __init__(self, connect, count: int):
        self.connect, self.count = connect, count
        self.socks: list[socket.socket] = []
        self.dropped = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket | None:
        try:
            s = self.connect()
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            return s
        except OSError:
            return None

    def _run(self) -> None:
        self.socks = [s for s in (self._open() for _ in range(self.count)) if s]
        while not self.stop.wait(1.0):
            for i, s in enumerate(self.socks):
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    self.dropped += 1
                    s.close()
                    self.socks[i] = self._open() or s
            while len(self.socks) < self.count and (s := self._open()):
                self.socks.append(s)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


def test_a_slowloris_crowd_holds_neither_health_nor_scrapes(cli, state_dir):
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    agent = start_agent(state_dir, agent_args=("--metrics-listen", "127.0.0.1:0"))
    try:
        port = int(wait_for(lambda: metrics_port(agent), 10, "the metrics listener's port"))
        # The listener binds before the first sample: until that lands /healthz rightly says 503 (no snapshot).
        wait_for(lambda: (r := get(agent.sock, "/healthz")) is not None and r.status == 200, 10, "the first snapshot")

        def unix():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(str(agent.sock))
            return s

        def tcp():
            return socket.create_connection(("127.0.0.1", port), timeout=2)

        with Crowd(unix, 150) as api_crowd, Crowd(tcp, 60) as scrape_crowd:
            wait_for(lambda: len(api_crowd.socks) >= 100 and len(scrape_crowd.socks) >= 60, 10, "the crowds")
            health, scrapes = [], []
            end = time.monotonic() + 7  # past the 5 s request deadline: the crowd's dropped slots are retaken
            while time.monotonic() < end:
                reply = get(agent.sock, "/healthz", timeout=2)
                health.append(reply.status if reply is not None else None)
                scrapes.append(_scrape(port))
            assert api_crowd.dropped > 0 and scrape_crowd.dropped > 0, "the crowd was never cut off"
        assert health and all(h == 200 for h in health), health
        assert scrapes and all(scrapes), scrapes
    finally:
        agent.stop()


def _scrape(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return data.startswith(b"HTTP/1.0 200") and b"gpuwarden" in data
    except OSError:
        return False
