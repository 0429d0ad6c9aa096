"""The connection cap the agent's API and the metrics listener share (ops/foundation/connlimit.py), on a real unix-socket
server: a request already whole is served ahead of a crowd queued before it, and is never dropped as slow.

The agent-level behaviour under a reconnecting crowd is tests/integration/project/test_harden_slowloris.py; these pin the two rules
that keep an honest client's wait short there, without depending on how busy the machine is.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler

import pytest
from helpers.simnode import wait_for
from helpers.sleepers import sleeps

from gpuwarden.ops.foundation.connlimit import ConnectionCap

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
        if first.startswith(b"GET /honest") and not self.server.hold_after_read:
            self.server.release.wait(30)  # a handler thread the scheduler has not run yet

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if self.path == "/honest" and self.server.hold_after_read:
            self.server.read_in.set()
            self.server.release.wait(30)  # its bytes taken off the socket, not yet reported as read
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
        self.started: list[bytes] = []  # in the order handler threads ran (the scheduler's)
        self.dispatched: list[bytes] = []  # in the order the accepting thread handed them to a thread
        self.release = threading.Event()
        self.hold_after_read = False
        self.read_in = threading.Event()
        self.thread: threading.Thread | None = None
        super().__init__(path, Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the crowd hanging up mid-request

    def process_request(self, request: socket.socket, client_address: object) -> None:
        try:
            self.dispatched.append(request.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:  # accepted before its client sent a byte
            self.dispatched.append(b"")
        super().process_request(request, client_address)

    def serve_in_background(self) -> None:
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()


@pytest.fixture
def server_at(tmp_path):
    made: list[Server] = []

    def make(max_clients: int, serve: bool = True) -> Server:
        server = Server(str(tmp_path / f"s{len(made)}.sock"), max_clients)
        made.append(server)
        if serve:
            server.serve_in_background()
        return server

    yield make
    for server in made:
        server.release.set()
        if server.thread is not None:
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
    server.serve_in_background()
    try:
        assert answer(honest).startswith(b"HTTP/1.1 200")
        wait_for(lambda: len(server.started) == 41, 30, "every queued connection's handler")
        # Arrival order would have started 40 of the crowd's handlers first (each a thread start: milliseconds
        # apiece on a loaded machine, which is what kept /healthz waiting behind a slowloris crowd). The order
        # asserted is the accepting thread's: which handler thread the scheduler runs first is not the cap's to say.
        assert server.dispatched[0].startswith(b"GET /honest"), server.dispatched[:3]
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


def test_a_whole_request_its_handler_is_still_parsing_is_never_dropped_as_slow(server_at):
    server = server_at(2, serve=False)
    server.hold_after_read = True
    honest = connect(server, HONEST)  # queued whole before the server takes it, as behind a crowd
    server.serve_in_background()
    assert server.read_in.wait(30), "the honest handler never read its request"
    # Its socket peeks empty now (the handler's buffered reader holds the bytes): only what was seen at accept
    # keeps it from being taken for the slowest connection.
    crowd = [connect(server, CROWD_HEAD) for _ in range(5)]
    try:
        wait_for(lambda: server.evicted >= 3, 30, "the crowd dropping its own")
        server.release.set()
        assert answer(honest).startswith(b"HTTP/1.1 200")
    finally:
        for s in crowd:
            s.close()


def _voluntary_switches(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return sleeps(os.getpid(), thread.native_id)


def test_the_deadline_watcher_sleeps_while_no_connection_is_timed(server_at):
    # An idle agent's watcher woke four times a second with nothing to time (a device profile found it). Once the
    # last timed connection is gone it must not wake at all; it still drops a slow one afterwards.
    server = server_at(4)
    slow = connect(server, CROWD_HEAD)
    wait_for(lambda: server._watcher is not None and server.started, 30, "the watcher and the slow handler")
    slow.close()
    wait_for(lambda: server.active == 0, 30, "the slow connection's handler ending")
    watcher = server._watcher
    before = _voluntary_switches(watcher)
    # Absence of activity can only be seen over a window: 1 s is four rounds of the old watcher.
    threading.Event().wait(1.0)
    assert _voluntary_switches(watcher) - before <= 1
    server.request_deadline_s = 0.2
    again = connect(server, CROWD_HEAD)
    try:
        wait_for(lambda: server.evicted >= 1, 30, "the watcher waking for a newly timed connection")
    finally:
        again.close()
