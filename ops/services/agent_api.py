"""The agent's local HTTP API over a unix socket: /healthz, /v1/snapshot, /v1/history, /v1/events (and its
streaming form, ?follow=1). `curl --unix-socket <state dir>/agent.sock http://agent/v1/snapshot` works.

One thread per connection with socket timeouts, a cap on connections, and peer credentials checked on accept:
a client that never reads, or a crowd of them, cannot block the agent's sampling.
"""

from __future__ import annotations

import email.utils
import grp
import json
import os
import socket
import socketserver
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol

from gpuwarden.ops.foundation.connlimit import ConnectionCap
from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.waitfd import readable
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.agent import query
from gpuwarden.ops.agent.events import EventLog
from gpuwarden.ops.agent.history import History
from gpuwarden.ops.agent.query import BadRequest


class MetricsText(Protocol):
    """What /metrics asks of the exporter (ops/metrics' MetricsExporter, a layer above the agent)."""

    def text(self, per_process: bool = False, hostname: bool = False) -> bytes: ...


class Served(Protocol):
    """What the API reads of the agent it serves (daemon.Agent); the daemon imports this module, not the reverse."""

    stopping: bool
    events: EventLog
    history: History
    metrics: MetricsText | None

    def health(self) -> dict[str, Any]: ...
    def snapshot_document(self) -> tuple[bytes | tuple[bytes, ...], bool, bool] | None: ...
    def backend_name(self) -> str: ...
    def log(self, level: str, text: str) -> None: ...

MAX_CLIENTS = 64
# Slots event streams (which hold theirs for as long as they like) may not take: /healthz, /metrics and
# one-shot queries always find room.
RESERVED_SLOTS = 8
# A client that sends no request (or stops reading a small answer) for this long is dropped, so a crowd of
# silent connections holds the connection slots for seconds, not forever.
IO_TIMEOUT_S = 2.0
STREAM_TIMEOUT_S = 10.0  # a streaming client may stop reading this long before it is dropped
STREAM_CHECK_S = 5.0  # a streaming client that went away is noticed within this


def api_error(message: str, status: int, hint: str | None = None) -> dict[str, Any]:
    return document("api-error", {"error": message, "hint": hint, "status": status})


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


def _groups_of(pid: int) -> set[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


class Access:
    """Who may talk to the agent: root, the agent's own user, and members of the configured group."""

    def __init__(self, group: str | None):
        self.gid = grp.getgrnam(group).gr_gid if group else None

    def allows(self, pid: int, uid: int, gid: int) -> bool:
        if uid in (0, os.geteuid()):
            return True
        return self.gid is not None and (gid == self.gid or self.gid in _groups_of(pid))


class ApiServer(ConnectionCap, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    # Room for a crowd that reconnects faster than the accepting thread takes it (the kernel caps this at
    # net.core.somaxconn): with 128, 300 silent connections made one probe in 50 meet a full queue (issue 39).
    request_queue_size = 512

    def __init__(self, path: Path, agent: Served, access: Access, max_clients: int = MAX_CLIENTS):
        self.agent = agent
        self.access = access
        self.init_cap(max_clients)
        self.refused = 0
        self.streams = 0
        super().__init__(str(path), Handler)

    # A stream server's request is its connection's socket: typeshed's BaseServer types it for datagram servers too.
    def verify_request(self, request: socket.socket, client_address: object) -> bool:  # type: ignore[override]
        try:
            pid, uid, gid = peer_credentials(request)
        except OSError:
            return False
        if not self.access.allows(pid, uid, gid):
            self.refused += 1
            return False
        return True

    def refuse(self, request: socket.socket) -> None:
        # Answer in this thread without reading the request: cheap, and never blocks (non-blocking send).
        try:
            request.setblocking(False)
            body = json.dumps(api_error("too many clients", 503, "retry in a moment")).encode()
            request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        except OSError:
            pass

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up mid-answer is not the agent's problem; nothing to print

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if not snapshot_inline(self, request):
            super().process_request(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpuwarden-agent"
    timeout = IO_TIMEOUT_S
    server: ApiServer
    _answered = False  # an answer went out on this connection: the next request waits until it is taken

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # one line per request would drown the events in journald

    def handle_one_request(self) -> None:
        super().handle_one_request()
        self._answered = True
        if not self.close_connection:  # kept alive: the next request has its own deadline
            self.server.awaiting_request(self.connection)

    def parse_request(self) -> bool:
        # One request in flight per connection: a client that pipelines requests and never reads the answers
        # gets no second answer until it took the first, and loses its slot (then its connection) meanwhile.
        if self._answered and not self.server.wait_answer_taken(self.connection):
            self.close_connection = True
            return False
        ok = super().parse_request()  # reads the headers
        self.server.request_read(self.connection)  # the request line and headers are in: no deadline now
        if ok and self.request_version == "HTTP/0.9":  # `GET /path` alone: its answer would have no status line
            self.send_error(400, "HTTP/0.9 is not spoken here")
            return False
        return ok

    def address_string(self) -> str:
        return "unix"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed requests (bad request line, headers, versions) get JSON too, with a status line."""
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.1"
        body = json.dumps(api_error(message or "bad request", code, "speak HTTP/1.x, e.g. curl --unix-socket"))
        try:
            self._send(code, body.encode(), {"Connection": "close"})
        except OSError:
            pass

    # --- routing --------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (the base class's name)
        path, _, qs = self.path.partition("?")
        route = {"/healthz": self._healthz, "/v1/snapshot": self._snapshot, "/v1/history": self._history,
                 "/v1/events": self._events, "/metrics": self._metrics}.get(path)
        if route is None:
            self._json(api_error(f"no such endpoint {path[:80]!r}", 404,
                                 "endpoints: /healthz, /v1/snapshot, /v1/history, /v1/events"), 404)
            return
        try:
            route(qs)
        except BadRequest as exc:
            self._json(api_error(str(exc), 400), 400)
        except (BrokenPipeError, ConnectionResetError, TimeoutError, socket.timeout):
            self.close_connection = True
        except Exception as exc:  # a bug answers 500 with one line, never a traceback to the client
            self.server.agent.log("error", f"API {path}: {type(exc).__name__}: {exc}")
            try:
                self._json(api_error(f"internal error: {type(exc).__name__}", 500, "see the agent's log"), 500)
            except OSError:
                self.close_connection = True

    def _not_allowed(self) -> None:
        self._json(api_error(f"method {self.command} not allowed", 405, "the API is read-only: use GET"), 405,
                   {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815

    def do_HEAD(self) -> None:  # noqa: N802
        self._json(api_error("use GET", 405), 405, {"Allow": "GET"})

    # --- endpoints ------------------------------------------------------------------------------
    def _healthz(self, qs: str) -> None:
        query.parse(qs, {})
        health = self.server.agent.health()
        self._json(health, 200 if health["ok"] else 503)

    def _snapshot(self, qs: str) -> None:
        query.parse(qs, {})
        served = self.server.agent.snapshot_document()
        if served is None:
            self._json(api_error("no snapshot yet", 503, "the agent has just started; retry in a second"), 503)
            return
        body, attention, stale = served
        self._send(200, body, {"X-Gpuwarden-Needs-Attention": "1" if attention else "0",
                               "X-Gpuwarden-Stale": "1" if stale else "0",
                               "X-Gpuwarden-Backend": self.server.agent.backend_name()}, gather=True)

    def _metrics(self, qs: str) -> None:
        """The Prometheus exposition (what `gpuwarden metrics` prints when an agent runs)."""
        params = query.parse(qs, {"per_process": "1 for VRAM per process", "hostname": "1 for a hostname label"})
        exporter = self.server.agent.metrics
        if exporter is None:
            self._json(api_error("no metrics exporter in this agent", 404), 404)
            return
        body = exporter.text(query.flag(params, "per_process"), query.flag(params, "hostname"))
        if not body:
            self._json(api_error("no snapshot yet", 503, "the agent has just started; retry in a second"), 503)
            return
        self._send(200, body, {"X-Gpuwarden-Backend": self.server.agent.backend_name()},
                   content_type="text/plain; version=0.0.4; charset=utf-8")

    def _history(self, qs: str) -> None:
        params = query.parse(qs, {"gpu": "a GPU index", "since": "30m, 2h, an epoch time or ISO-8601",
                                  "resolution": "auto, fine or minute", "events": "1 to include the events"})
        agent = self.server.agent
        gpu = query.integer(params, "gpu", 0, 1023)
        since = query.moment(params, "since")
        resolution = query.choice(params, "resolution", ("auto", "fine", "minute"), "auto")
        events = agent.events.since(ts=since, gpu=gpu, limit=10000) if query.flag(params, "events") else None
        self._json(agent.history.document(gpu, since, resolution, events))

    def _events(self, qs: str) -> None:
        params = query.parse(qs, {"after": "a sequence number", "since": "30m, 2h, an epoch time or ISO-8601",
                                  "limit": "1-10000", "gpu": "a GPU index", "follow": "1 to stream"})
        log = self.server.agent.events
        after = query.integer(params, "after", 0, 1 << 62)
        since = query.moment(params, "since")
        limit = query.integer(params, "limit", 1, 10000, 1000)
        gpu = query.integer(params, "gpu", 0, 1023)
        items = log.since(after, since, limit, gpu)
        if not query.flag(params, "follow"):
            now = time.time()
            self._json(document("events", {"generated_at": now, "generated_at_iso": iso(now),
                                           "last_seq": log.last_seq, "events": items}))
            return
        server = self.server
        with server._count_lock:
            room = server.streams < server.max_clients - RESERVED_SLOTS
            server.streams += room
        if not room:
            self._json(api_error("too many event streams", 503, "close a stream, or poll /v1/events?after=SEQ"),
                       503, {"Connection": "close"})
            self.close_connection = True
            return
        try:
            self._stream(items, after if after is not None else log.last_seq if since is None else 0, gpu)
        finally:
            with server._count_lock:
                server.streams -= 1

    def _stream(self, first: list[dict[str, Any]], after: int, gpu: int | None) -> None:
        """One event document per line until the client goes away or the agent stops."""
        self.close_connection = True
        self.connection.settimeout(STREAM_TIMEOUT_S)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        log, agent = self.server.agent.events, self.server.agent
        items = first
        seq = max([after] + [e["seq"] for e in first])
        while True:
            for e in items:
                if gpu is None or e.get("gpu") == gpu:
                    self.wfile.write((json.dumps(document("event", e), separators=(",", ":")) + "\n").encode())
            self.wfile.flush()
            if items:
                seq = max(seq, items[-1]["seq"])
            if agent.stopping or self._client_gone():
                return
            items = log.wait(seq, STREAM_CHECK_S)

    def _client_gone(self) -> bool:
        """A streaming client sends nothing; readable with no data means it closed its end."""
        try:
            return readable(self.connection, 0) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # --- writing --------------------------------------------------------------------------------
    def _json(self, doc: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(doc, separators=(",", ":"), default=str).encode(), headers)

    def _send(self, status: int, body: bytes | tuple[bytes, ...], headers: dict[str, str] | None = None,
              content_type: str = "application/json", gather: bool = False) -> None:
        parts = (body,) if isinstance(body, bytes) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(sum(len(p) for p in parts)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        # The write deadline is the socket's timeout (IO_TIMEOUT_S: sendall's is the total, since Python 3.5);
        # the answer is not marked as waiting meanwhile: an honest client mid-answer must not be the one a
        # crowd of slow senders evicts. A client that does not read is caught before its next request.
        self.end_headers()
        if gather:
            send_gathered(self.connection, parts)
            return
        for part in parts:
            self.wfile.write(part)


_SNAPSHOT_LINES = (b"GET /v1/snapshot HTTP/1.1", b"GET /v1/snapshot HTTP/1.0")


def snapshot_inline(server: ApiServer, conn: socket.socket) -> bool:
    """Answer a plain `GET /v1/snapshot` in the accepting thread, without a thread for the connection: its
    request already whole in the socket (peeked, never waited for), the answer the snapshot's bytes made once per
    snapshot, written in one non-blocking gathered send into a send buffer grown to hold it, then the connection
    closed. A thread start and the HTTP parser per request were most of a request's CPU, and a burst of pollers
    queued behind those thread starts. False (nothing read or written) for anything else: the handler serves it.
    An answer the buffer cannot take whole is finished by a thread of its own under the usual write timeout."""
    if conn.gettimeout() is not None:
        return False  # a socket with a timeout would wait inside each call, MSG_DONTWAIT or not
    try:
        head = conn.recv(8192, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False
    end = head.find(b"\r\n\r\n")
    if end < 0 or len(head) != end + 4 or head[:head.find(b"\r\n")] not in _SNAPSHOT_LINES:
        return False  # not whole yet, pipelined, or another request: the handler's
    served = server.agent.snapshot_document()
    if served is None:
        return False  # "no snapshot yet" is the handler's answer
    body, attention, stale = served
    parts = (body,) if isinstance(body, bytes) else body
    try:
        conn.recv(len(head), socket.MSG_DONTWAIT)  # taken off the socket: closing on unread data resets the client
    except OSError:
        server.shutdown_request(conn)
        return True
    answer = (f"HTTP/1.1 200 OK\r\nServer: {Handler.server_version}\r\n"
              f"Date: {email.utils.formatdate(usegmt=True)}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {sum(len(p) for p in parts)}\r\nCache-Control: no-store\r\n"
              f"X-Gpuwarden-Needs-Attention: {'1' if attention else '0'}\r\n"
              f"X-Gpuwarden-Stale: {'1' if stale else '0'}\r\n"
              f"X-Gpuwarden-Backend: {server.agent.backend_name()}\r\nConnection: close\r\n\r\n").encode()
    views = _grow_and_view(conn, (answer, *parts))
    try:
        _advance(views, conn.sendmsg(views, [], socket.MSG_DONTWAIT))
    except BlockingIOError:
        pass
    except OSError:
        server.shutdown_request(conn)
        return True
    if not views:
        server.shutdown_request(conn)
        return True

    def finish() -> None:
        try:
            conn.settimeout(IO_TIMEOUT_S)
            _send_views(conn, views)
        except OSError:
            pass
        finally:
            server.shutdown_request(conn)
    threading.Thread(target=finish, name="api-finish", daemon=True).start()
    return True


def _grow_and_view(conn: socket.socket, parts: tuple[bytes, ...]) -> list[memoryview]:
    total = sum(len(p) for p in parts)
    try:
        # Linux doubles the value asked for and caps it at wmem_max; a failure leaves the default (~200 KiB).
        if conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < total + 4096:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, total + 4096)
    except OSError:
        pass
    return [memoryview(p) for p in parts if p]


def _advance(views: list[memoryview], sent: int) -> None:
    """Drop `sent` bytes off the front of `views`."""
    while sent and views:
        if sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0


def _send_views(conn: socket.socket, views: list[memoryview]) -> None:
    while views:
        _advance(views, conn.sendmsg(views))


def send_gathered(conn: socket.socket, parts: tuple[bytes, ...]) -> None:
    """The parts written as one answer: one sendmsg of them all (no copy joining them), with the send buffer
    grown to hold the whole answer where the kernel allows (net.core.wmem_max), so a big node's snapshot
    (~1 MB) goes out in one call and the handler is done, instead of waking once per 200 KiB the client reads.
    Partial sends (the socket's timeout makes it non-blocking underneath) continue where they stopped; the
    deadline is the socket's timeout for each wait, as sendall's."""
    _send_views(conn, _grow_and_view(conn, parts))


def bind(path: Path, agent: Served, group: str | None) -> ApiServer:
    """Listen on `path` (mode 0660, the configured group): a stale socket file is replaced, a live one refused."""
    try:
        access = Access(group)
    except KeyError:
        raise GpuwardenError(f"[agent] socket_group {group!r} is not a group on this node",
                             "create it (groupadd) or fix the node config") from None
    if path.exists() or path.is_symlink():
        if not path.is_socket():
            raise GpuwardenError(f"{path} exists and is not a socket", "move it aside; the agent creates its socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens: left behind by an agent that was killed
        else:
            raise GpuwardenError(f"another agent answers on {path}", "stop it first (systemctl stop gpuwarden-agent)")
        finally:
            probe.close()
    old = os.umask(0o117)  # the socket is born 0660: no moment where others could connect
    try:
        server = ApiServer(path, agent, access)
    except OSError as exc:
        raise GpuwardenError(f"cannot listen on {path}: {exc.strerror or exc}",
                             "a unix socket path must be under 108 bytes and its directory writable: "
                             "use a shorter --state-dir or --listen-unix") from None
    finally:
        os.umask(old)
    if access.gid is not None:
        os.chown(path, -1, access.gid)
    os.chmod(path, 0o660)
    return server
