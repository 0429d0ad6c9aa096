"""The connection cap the agent's API and the metrics listener share (ops/connlimit.py), on a real unix-socket
server: a request already whole is served ahead of a crowd queued before it, and is never dropped as slow.

The agent-level behaviour under a reconnecting crowd is tests/test_harden_slowloris.py; these pin the two rules
that keep an honest client's wait short there, without depending on how busy the machine is.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler

import pytest
from simnode import wait_for

from gpuwarden.ops.connlimit import ConnectionCap

CROWD_HEAD = b"GET /slow HTTP/1.1\r\nHost: x\r\n"  # a request that never ends
HONEST = b"GET /honest HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: Server

    def setup(self) -> None:
        super().setup()
        first = self.request.recv(64, socket.MSG_PEEK)
        self.server.started.append(first)
        if first.startswith(b"GET /honest"):
            self.server.release.wait(30)  # a handler thread the scheduler has not run yet

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.request_read(self.connection)
        return ok

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


class Server(ConnectionCap, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, path: str, max_clients: int):
        self.init_cap(max_clients)
        self.started: list[bytes] = []
        self.release = threading.Event()
        super().__init__(path, Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the crowd hanging up mid-request


@pytest.fixture
def server_at(tmp_path):
    made: list[tuple[Server, threading.Thread]] = []

    def make(max_clients: int, serve: bool = True) -> Server:
        server = Server(str(tmp_path / f"s{len(made)}.sock"), max_clients)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        made.append((server, thread))
        if serve:
            thread.start()
        return server

    yield make
    for server, thread in made:
        server.release.set()
        if thread.is_alive():
            server.shutdown()
        server.server_close()


def connect(server: Server, payload: bytes) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(server.server_address)
    s.sendall(payload)
    return s


def answer(s: socket.socket) -> bytes:
    chunks = []
    while data := s.recv(4096):
        chunks.append(data)
    return b"".join(chunks)


def test_a_whole_request_is_served_ahead_of_a_crowd_queued_before_it(server_at):
    server = server_at(64, serve=False)
    crowd = [connect(server, CROWD_HEAD) for _ in range(40)]
    honest = connect(server, HONEST)
    server.release.set()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        assert answer(honest).startswith(b"HTTP/1.1 200")
        wait_for(lambda: len(server.started) == 41, 30, "every queued connection's handler")
        # Arrival order would have started 40 of the crowd's handlers first (each a thread start: milliseconds
        # apiece on a loaded machine, which is what kept /healthz waiting behind a slowloris crowd).
        assert server.started[0].startswith(b"GET /honest"), server.started[:3]
    finally:
        for s in crowd:
            s.close()


def test_a_whole_request_not_yet_read_is_never_dropped_as_slow(server_at):
    server = server_at(2)
    honest = connect(server, HONEST)
    wait_for(lambda: server.started, 30, "the honest client's handler")
    # The one slot left is fought over by a crowd: each newcomer takes the slot of the oldest still sending.
    crowd = [connect(server, CROWD_HEAD) for _ in range(5)]
    try:
        wait_for(lambda: server.evicted >= 3, 30, "the crowd dropping its own")
        server.release.set()
        assert answer(honest).startswith(b"HTTP/1.1 200")
    finally:
        for s in crowd:
            s.close()
