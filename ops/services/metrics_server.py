"""The /metrics HTTP(S) listener: prometheus_client's WSGI app (content negotiation, gzip) behind a threaded
server with socket timeouts, a cap on connections and the TLS handshake done in each connection's own thread.

prometheus_client's start_http_server wraps its listening socket, so one client that connects and never
finishes the TLS handshake would stall accept() for everyone: hence this small server around its app.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from gpuwarden.ops.foundation.connlimit import ConnectionCap
from gpuwarden.ops.foundation.errors import GpuwardenError

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

DEFAULT_LISTEN = "127.0.0.1:9835"
IO_TIMEOUT_S = 10.0  # a scraper that stops reading (or a half-open TLS handshake) is dropped after this
MAX_CLIENTS = 16


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # with it, clients must present a certificate it signed (mutual TLS)

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as exc:
            raise GpuwardenError(f"cannot load the metrics TLS certificate {self.cert} / key {self.key}: "
                                 f"{getattr(exc, 'strerror', None) or exc}",
                                 "give a PEM certificate chain and its unencrypted PEM key") from None
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca))
            except (OSError, ssl.SSLError) as exc:
                raise GpuwardenError(f"cannot load the metrics client CA {self.client_ca}: "
                                     f"{getattr(exc, 'strerror', None) or exc}", "give a PEM CA bundle") from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or :PORT (all interfaces) -> (host, port); port 0 takes a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise GpuwardenError(f"--metrics-listen {value!r} is not HOST:PORT",
                             f"e.g. {DEFAULT_LISTEN} (this node only) or 0.0.0.0:9835 (for Prometheus elsewhere)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _Quiet(WSGIRequestHandler):
    timeout = IO_TIMEOUT_S
    server: MetricsServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass  # one line per scrape would drown the agent's log

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the headers
        self.server.request_read(self.connection)  # the request is in: its send deadline no longer applies
        return ok


class MetricsServer(ConnectionCap, ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], app: WSGIApplication, tls: ssl.SSLContext | None,
                 max_clients: int = MAX_CLIENTS):
        self.address_family = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM,
                                                 flags=socket.AI_PASSIVE)[0][0]
        self.tls = tls
        self.init_cap(max_clients)  # past it a scraper is closed on: Prometheus retries at its next interval
        super().__init__(address, _Quiet)
        self.set_app(app)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would ask getfqdn() for a name: a reverse DNS lookup that can hang at start.
        socketserver.TCPServer.server_bind(self)
        # What server_bind set server_address to: the bound socket's (host, port, ...), host as text.
        self.server_name, self.server_port = self.socket.getsockname()[:2]
        self.setup_environ()

    # A TCP server's request is its connection's socket: typeshed's BaseServer types it for datagram servers too.
    def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        request.settimeout(IO_TIMEOUT_S)
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        # The handshake, in this connection's thread, under the request deadline (the watcher shuts `request`
        # down, which ends a stalled handshake); the TLS socket takes over the descriptor afterwards.
        wrapped = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        self.replace_connection(request, wrapped)
        wrapped.do_handshake()
        try:
            super().finish_request(wrapped, client_address)
        finally:
            self.forget(wrapped)
            wrapped.close()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a scraper that hung up, a failed handshake: not the agent's problem


class Listener:
    """The running listener: start() binds (errors name the address), stop() closes."""

    def __init__(self, listen: str, app: WSGIApplication, tls: TlsFiles | None = None):
        self.listen = listen
        self.address = parse_listen(listen)
        self.app = app
        self.tls = tls
        self.server: MetricsServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = (self.server.server_name, self.server.server_port) if self.server else self.address
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls else 'http'}://{shown}:{port}/metrics"

    def start(self) -> str:
        ctx = self.tls.context() if self.tls else None
        try:
            self.server = MetricsServer(self.address, self.app, ctx)
        except (OSError, socket.gaierror) as exc:
            raise GpuwardenError(f"cannot listen for metrics on {self.listen}: {exc.strerror or exc}",
                                 "pick a free port or another address with --metrics-listen") from None
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="gpuwarden-metrics", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
