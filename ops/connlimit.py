"""A cap on the connections a threaded socketserver serves at once, shared by the agent's API and the metrics
listener, with a deadline for each connection to send its request (a slowloris client cannot hold a slot).

Past the cap, a new connection takes the slot of the oldest one still sending its request (those are the slow
ones: curl and Prometheus send theirs in a millisecond); with none to take, refuse() answers in the accepting
thread (cheaply, never blocking) and closes.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What the mixin is placed before: its super() calls reach a threading socketserver.
    class _Server(socketserver.ThreadingMixIn, socketserver.BaseServer):
        pass
else:
    _Server = object

# A connection must have sent its request line and headers this long after it was accepted (or after its last
# answer, on a kept-alive one): one header line a second resets no per-read timeout but meets this.
REQUEST_DEADLINE_S = 5.0
_WATCH_S = 0.25  # how often overdue connections are looked for


class ConnectionCap(_Server):
    """Mixin placed before socketserver.ThreadingMixIn; call init_cap(max_clients) in __init__, and
    request_read(sock) from the handler once a request is parsed (awaiting_request(sock) before the next one)."""

    request_deadline_s = REQUEST_DEADLINE_S

    def init_cap(self, max_clients: int) -> None:
        self.max_clients = max_clients
        self.active = 0
        self.evicted = 0  # connections dropped for being slow to send their request (oldest first or overdue)
        self._count_lock = threading.Lock()
        self._awaiting: dict[object, float] = {}  # connection -> when it started waiting for its request
        self._doomed: set[object] = set()  # shut down for slowness, their threads not yet finished
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def refuse(self, request: Any) -> None:
        """Answer a connection over the cap (default: just close it)."""

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count_lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="request-deadlines", daemon=True)
                self._watcher.start()
            full = self.active - len(self._doomed) >= self.max_clients
            if full and self._awaiting:
                self._drop(min(self._awaiting, key=self._awaiting.__getitem__))
                full = False
            if not full:
                self.active += 1
                self._awaiting[request] = time.monotonic()
        if full:
            self.refuse(request)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.active -= 1
                self._awaiting.pop(request, None)
                self._doomed.discard(request)
                if self.active == 0:
                    self._doomed.clear()  # a TLS socket that replaced its request

    def shutdown_request(self, request: Any) -> None:
        # Under the lock, so the deadline watcher never shuts a socket down while (or after) it is closed.
        with self._count_lock:
            self._awaiting.pop(request, None)
            super().shutdown_request(request)

    def server_close(self) -> None:
        self._watch_stop.set()
        super().server_close()

    # --- the handler's side ------------------------------------------------------------------------
    def request_read(self, request: Any) -> None:
        with self._count_lock:
            self._awaiting.pop(request, None)

    def awaiting_request(self, request: Any) -> None:
        with self._count_lock:
            if request not in self._doomed:
                self._awaiting[request] = time.monotonic()

    def replace_connection(self, old: Any, new: Any) -> None:
        """The handler now reads `new` (a TLS socket wrapping `old`, whose descriptor it took over)."""
        with self._count_lock:
            if old in self._awaiting:
                self._awaiting[new] = self._awaiting.pop(old)

    def forget(self, request: Any) -> None:
        with self._count_lock:
            self._awaiting.pop(request, None)
            self._doomed.discard(request)

    # --- deadlines ---------------------------------------------------------------------------------
    def _drop(self, sock: Any) -> None:
        """Shut a slow connection down (lock held): its thread's blocked read returns and the thread ends."""
        self._awaiting.pop(sock, None)
        self._doomed.add(sock)
        self.evicted += 1
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _watch(self) -> None:
        while not self._watch_stop.wait(_WATCH_S):
            cutoff = time.monotonic() - self.request_deadline_s
            with self._count_lock:
                for sock in [s for s, since in self._awaiting.items() if since < cutoff]:
                    self._drop(sock)
