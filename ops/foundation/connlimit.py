"""A cap on the connections a threaded socketserver serves at once, shared by the agent's API and the metrics
listener, with a deadline for each connection to send its request (a slowloris client cannot hold a slot).

Past the cap, a new connection takes the slot of the oldest one still sending its request (those are the slow
ones: curl and Prometheus send theirs in a millisecond); with none to take, refuse() answers in the accepting
thread (cheaply, never blocking) and closes. A crowd that reconnects as fast as it is dropped keeps the listen
queue full: the accepting thread takes the whole queue, and looks again before each connection it starts, serving
first those whose request is already whole, so an honest client waits behind none of the crowd's.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What the mixin is placed before: its super() calls reach a threading socketserver.
    class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
        pass
else:
    _Server = object

# A connection must have sent its request line and headers this long after it was accepted (or after its last
# answer, on a kept-alive one): one header line a second resets no per-read timeout but meets this.
REQUEST_DEADLINE_S = 5.0
_WATCH_S = 0.25  # how often overdue connections are looked for
_BATCH = 128  # connections accepted at one go (the servers' listen queues hold 64 and 128)
_PEEK_BYTES = 8192  # a request head longer than this is served in arrival order, like a slow one


def _sent_whole(sock: socket.socket) -> bool:
    """Whether the request line and headers already wait in the socket, unread (they are not taken off it).
    Never blocks: it is asked under the cap's lock."""
    flags = socket.MSG_PEEK | socket.MSG_DONTWAIT
    try:
        if sock.gettimeout() is None:
            head = sock.recv(_PEEK_BYTES, flags)
        else:
            # A socket with a timeout waits for data before it reads, MSG_DONTWAIT or not: peek through a twin
            # descriptor that has none.
            with socket.fromfd(sock.fileno(), sock.family, sock.type) as twin:
                head = twin.recv(_PEEK_BYTES, flags)
    except (OSError, ValueError):  # nothing yet, the peer went, or a TLS socket (which takes no flags)
        return False
    return b"\r\n\r\n" in head


class ConnectionCap(_Server):
    """Mixin placed before socketserver.ThreadingMixIn; call init_cap(max_clients) in __init__, and
    request_read(sock) from the handler once a request is parsed (awaiting_request(sock) before the next one)."""

    request_deadline_s = REQUEST_DEADLINE_S

    def init_cap(self, max_clients: int) -> None:
        self.max_clients = max_clients
        self.active = 0
        self.evicted = 0  # connections dropped for being slow to send their request (oldest first or overdue)
        self._count_lock = threading.Lock()
        self._awaiting: dict[socket.socket, float] = {}  # connection -> when it started waiting for its request
        self._doomed: set[socket.socket] = set()  # shut down for slowness, their threads not yet finished
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._queued: deque[tuple[Any, Any]] = deque()  # accepted in this wakeup's batch, not yet processed

    def refuse(self, request: Any) -> None:
        """Answer a connection over the cap (default: just close it)."""

    # --- the accepting thread ------------------------------------------------------------------------
    def server_activate(self) -> None:
        super().server_activate()
        self.socket.setblocking(False)  # get_request takes the whole listen queue, until it is empty

    def get_request(self) -> tuple[Any, Any]:
        if not self._queued:
            self._take_queue()
        if not self._queued:
            raise BlockingIOError("no connection waiting")  # serve_forever's caller ignores an OSError
        return self._queued.popleft()

    def _take_queue(self) -> None:
        """Accept what waits; connections whose request is already whole go ahead of every other."""
        whole: list[tuple[Any, Any]] = []
        rest: list[tuple[Any, Any]] = []
        for _ in range(_BATCH):
            try:
                accepted = super().get_request()
            except OSError:  # the queue is empty (BlockingIOError), or out of descriptors: select wakes us again
                break
            (whole if _sent_whole(accepted[0]) else rest).append(accepted)
        self._queued.extendleft(reversed(whole))
        self._queued.extend(rest)

    def service_actions(self) -> None:
        """serve_forever calls this after each wakeup: the rest of the queue, looking for new arrivals before
        each (a thread start costs milliseconds under load, and a crowd's batch is a hundred of them)."""
        super().service_actions()
        while True:
            self._take_queue()
            if not self._queued:
                return
            request, client_address = self._queued.popleft()
            if not self.verify_request(request, client_address):
                self.shutdown_request(request)
                continue
            try:
                self.process_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
                self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        # A request already in is not slow: kept off the list, so it is never dropped for it. _slowest's own peek
        # cannot stand in for this one: once the handler's buffered reader has taken the bytes off the socket,
        # and before it has parsed them, the socket peeks empty (measured: half the probes lost under a crowd).
        whole = _sent_whole(request)
        with self._count_lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="request-deadlines", daemon=True)
                self._watcher.start()
            full = self.active - len(self._doomed) >= self.max_clients
            if full and (victim := self._slowest()) is not None:
                self._drop(victim)
                full = False
            if not full:
                self.active += 1
                if not whole:
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
        while self._queued:
            self.shutdown_request(self._queued.popleft()[0])
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

    def _slowest(self) -> Any | None:
        """The connection that has been sending its request longest (lock held). One whose request turns out
        to be whole already (accepted before it was sent) is not slow: it leaves the list instead."""
        for sock in sorted(self._awaiting, key=self._awaiting.__getitem__):
            if not _sent_whole(sock):
                return sock
            del self._awaiting[sock]
        return None

    def _watch(self) -> None:
        while not self._watch_stop.wait(_WATCH_S):
            cutoff = time.monotonic() - self.request_deadline_s
            with self._count_lock:
                for sock in [s for s, since in self._awaiting.items() if since < cutoff]:
                    if _sent_whole(sock):
                        del self._awaiting[sock]  # its request is in: its thread has not been run to read it yet
                    else:
                        self._drop(sock)
