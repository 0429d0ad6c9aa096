"""A cap on the connections a threaded socketserver serves at once, shared by the agent's API and the metrics
listener, with a deadline for each connection to send its request (a slowloris client cannot hold a slot).

Past the cap, a new connection takes the slot of the oldest one still sending its request (those are the slow
ones: curl and Prometheus send theirs in a millisecond); with none to take, refuse() answers in the accepting
thread (cheaply, never blocking) and closes. A crowd that reconnects as fast as it is dropped keeps the listen
queue full: the accepting thread takes the whole queue, and looks again before each connection it starts, serving
first those whose request is already whole, so an honest client waits behind none of the crowd's.

A client that does not read its answers (it pipelines requests and never reads, issue 39 item 4) costs a bounded
amount too: its next request is not served until it took the last answer (one request in flight); while it
has not, its connection is the first to give up its slot, and it is dropped after WRITE_DEADLINE_S. (A write
itself is bounded by the socket timeout; it is not marked meanwhile, so no honest client mid-answer is evicted.)
"""

from __future__ import annotations

import fcntl
import select
import socket
import socketserver
import struct
import termios
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from gpuwarden.ops.foundation.waitfd import WakePipe

if TYPE_CHECKING:
    # What the mixin is placed before: its super() calls reach a threading socketserver.
    class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
        def _handle_request_noblock(self) -> None: ...  # socketserver.BaseServer's, which typeshed leaves out
else:
    _Server = object

# A connection must have sent its request line and headers this long after it was accepted (or after its last
# answer, on a kept-alive one): one header line a second resets no per-read timeout but meets this.
REQUEST_DEADLINE_S = 5.0
# An answer must have been taken by the client this long after it was written (a client that reads it takes
# it in microseconds; a /v1/snapshot of a big node is a few hundred KiB, well within one socket buffer).
WRITE_DEADLINE_S = 2.0
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


def unsent_bytes(sock: socket.socket) -> int | None:
    """Bytes written to `sock` that its peer has not taken yet (SIOCOUTQ, which is TIOCOUTQ's number); None
    where the socket cannot say. For a unix stream socket the kernel charges what waits in the peer's receive
    queue to the sender until the peer reads it (linux net/unix/af_unix.c, unix_ioctl -> unix_outq_len), so 0
    means the client has read every byte of its answer. For TCP it counts bytes not yet acknowledged."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return None
    return int(struct.unpack("i", raw)[0])


class ConnectionCap(_Server):
    """Mixin placed before socketserver.ThreadingMixIn; call init_cap(max_clients) in __init__, and
    request_read(sock) from the handler once a request is parsed (awaiting_request(sock) before the next one);
    wait_answer_taken(sock) before a kept-alive connection's next request."""

    request_deadline_s = REQUEST_DEADLINE_S
    write_deadline_s = WRITE_DEADLINE_S

    def init_cap(self, max_clients: int) -> None:
        self.max_clients = max_clients
        self.active = 0
        self.evicted = 0  # connections dropped for being slow to send their request (oldest first or overdue)
        self._count_lock = threading.Lock()
        self._awaiting: dict[socket.socket, float] = {}  # connection -> when it started waiting for its request
        self._unread: dict[socket.socket, float] = {}  # connection -> since when its answer waits for the client
        self._doomed: set[socket.socket] = set()  # shut down for slowness, their threads not yet finished
        # The deadline watcher sleeps until a connection is timed (an idle agent's watcher woke 4 times a second
        # for nothing: a fifth of its CPU on an idle H100); it is woken when one is, and when the server closes.
        self._watch_wake = threading.Condition(self._count_lock)
        self._closing = False
        self._watcher: threading.Thread | None = None
        self._queued: deque[tuple[Any, Any]] = deque()  # accepted in this wakeup's batch, not yet processed
        # serve_forever sleeps until a connection comes or shutdown() writes here (socketserver's own loop wakes
        # every poll_interval to look for a shutdown: an idle agent's API thread spent 0.27 ms/s on it).
        self._wake = WakePipe()
        self._stop_serving = False
        self._served_out = threading.Event()
        self._served_out.set()

    def refuse(self, request: Any) -> None:
        """Answer a connection over the cap (default: just close it)."""

    # --- the accepting thread ------------------------------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """socketserver's loop, asleep until a connection comes or shutdown() is called (poll_interval is not used:
        nothing needs a timer here)."""
        self._served_out.clear()
        try:
            poller = select.poll()  # not select(): the agent holds thousands of descriptors, this may be past 1024
            listening = self.socket.fileno()
            poller.register(listening, select.POLLIN)
            poller.register(self._wake.fd, select.POLLIN)
            while not self._stop_serving:
                ready = poller.poll()
                if self._stop_serving or any(mask & select.POLLNVAL for _, mask in ready):
                    break  # stopped, or a descriptor closed under the loop (server_close without shutdown)
                if any(fd == listening for fd, _ in ready):
                    self._handle_request_noblock()
                self.service_actions()
        except (OSError, ValueError):
            if not self._stop_serving:
                raise
            # shutdown() and server_close() came before this loop had registered the socket: nothing to serve
        finally:
            self._stop_serving = False
            self._wake.drain()
            self._served_out.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait until it has (from another thread, as socketserver's)."""
        self._stop_serving = True
        self._wake.wake()
        self._served_out.wait()

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
                    self._first_timed()
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
                self._unread.pop(request, None)
                self._doomed.discard(request)
                if self.active == 0:
                    self._doomed.clear()  # a TLS socket that replaced its request

    def shutdown_request(self, request: Any) -> None:
        # Under the lock, so the deadline watcher never shuts a socket down while (or after) it is closed.
        with self._count_lock:
            self._awaiting.pop(request, None)
            self._unread.pop(request, None)
            super().shutdown_request(request)

    def server_close(self) -> None:
        with self._count_lock:
            self._closing = True
            self._watch_wake.notify()
        while self._queued:
            self.shutdown_request(self._queued.popleft()[0])
        super().server_close()
        self._wake.close()

    # --- the handler's side ------------------------------------------------------------------------
    def request_read(self, request: Any) -> None:
        with self._count_lock:
            self._awaiting.pop(request, None)

    def awaiting_request(self, request: Any) -> None:
        with self._count_lock:
            if request not in self._doomed:
                self._awaiting[request] = time.monotonic()
                self._first_timed()

    def answer_pending(self, request: Any) -> None:
        """An answer written to `request` waits for its client to take it: the connection is the first to give its
        slot up, and is dropped once it has waited write_deadline_s."""
        with self._count_lock:
            if request not in self._doomed:
                self._unread.setdefault(request, time.monotonic())
                self._first_timed()

    def answer_taken(self, request: Any) -> None:
        with self._count_lock:
            self._unread.pop(request, None)

    def dropped(self, request: Any) -> bool:
        """Whether `request` was shut down for slowness (its handler should stop waiting on it)."""
        with self._count_lock:
            return request in self._doomed

    def wait_answer_taken(self, request: Any) -> bool:
        """Before a kept-alive connection's next request: whether its client took the last answer, waiting for it up
        to write_deadline_s (one request in flight per connection). Meanwhile the connection may lose its slot."""
        left = unsent_bytes(request)
        if not left:  # 0: taken; None: a socket that cannot say (TLS over TCP) is trusted
            return True
        self.answer_pending(request)
        try:
            deadline = time.monotonic() + self.write_deadline_s
            pause = 0.001
            while time.monotonic() < deadline and not self.dropped(request):
                # A client that reads does so within a millisecond or two: back off to 50 ms for one that does not.
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
                if not unsent_bytes(request):
                    return True
            return False
        finally:
            self.answer_taken(request)

    def replace_connection(self, old: Any, new: Any) -> None:
        """The handler now reads `new` (a TLS socket wrapping `old`, whose descriptor it took over)."""
        with self._count_lock:
            if old in self._awaiting:
                self._awaiting[new] = self._awaiting.pop(old)
            if old in self._unread:
                self._unread[new] = self._unread.pop(old)

    def forget(self, request: Any) -> None:
        with self._count_lock:
            self._awaiting.pop(request, None)
            self._unread.pop(request, None)
            self._doomed.discard(request)

    # --- deadlines ---------------------------------------------------------------------------------
    def _drop(self, sock: Any) -> None:
        """Shut a slow connection down (lock held): its thread's blocked read returns and the thread ends."""
        self._awaiting.pop(sock, None)
        self._unread.pop(sock, None)
        self._doomed.add(sock)
        self.evicted += 1
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _slowest(self) -> Any | None:
        """The connection whose answer has waited longest for its client to take it, else the one that has been
        sending its request longest (lock held). One whose request turns out to be whole already (accepted
        before it was sent) is not slow: it leaves the list instead."""
        if self._unread:
            return min(self._unread, key=self._unread.__getitem__)
        for sock in sorted(self._awaiting, key=self._awaiting.__getitem__):
            if not _sent_whole(sock):
                return sock
            del self._awaiting[sock]
        return None

    def _first_timed(self) -> None:
        """(lock held, after a connection was timed) Wake the watcher if it slept with nothing to time; later ones
        need no wake-up, the watcher is on its 0.25 s round."""
        if len(self._awaiting) + len(self._unread) == 1:
            self._watch_wake.notify()

    def _watch(self) -> None:
        with self._count_lock:  # Condition.wait gives it up while asleep
            while not self._closing:
                if not self._awaiting and not self._unread:
                    self._watch_wake.wait()  # nothing is timed: asleep until a connection is
                    continue
                self._watch_wake.wait(_WATCH_S)
                cutoff = time.monotonic() - self.request_deadline_s
                for sock in [s for s, since in self._awaiting.items() if since < cutoff]:
                    if _sent_whole(sock):
                        del self._awaiting[sock]  # its request is in: its thread has not been run to read it yet
                    else:
                        self._drop(sock)
                cutoff = time.monotonic() - self.write_deadline_s
                for sock in [s for s, since in self._unread.items() if since < cutoff]:
                    self._drop(sock)
