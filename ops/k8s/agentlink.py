"""The latest snapshot over the agent's unix socket (HTTP), for commands that run inside a pod.

Until the node agent (issue 10) lands, `gpuwarden k8s-agent` serves the same two things here:
GET /v1/snapshot -> the gpuwarden.snapshot/1 document of its last sample. One adapter, one place to rewire.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

from ..model import NodeSnapshot, snapshot_from_dict

SOCKET_NAME = "agent.sock"
PATH = "/v1/snapshot"


def socket_path(state_dir: Path) -> Path:
    return Path(os.environ.get("GPUWARDEN_AGENT_SOCKET") or Path(state_dir) / SOCKET_NAME)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def ask(state_dir: Path, timeout_s: float = 2.0) -> NodeSnapshot | None:
    """The agent's last snapshot, or None when no agent answers (the caller samples by itself)."""
    path = socket_path(state_dir)
    if not path.exists():
        return None
    conn = _UnixConnection(str(path), timeout_s)
    try:
        conn.request("GET", PATH)
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        doc = json.loads(resp.read())
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    return snapshot_from_dict(doc.get("snapshot") or doc)


class SnapshotServer:
    """Serves `latest()` as a JSON document on a unix socket, from a daemon thread."""

    def __init__(self, path: Path, latest: Callable[[], dict | None]):
        self.path = path
        latest_fn = latest

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                doc = latest_fn() if self.path == PATH else None
                data = json.dumps(doc, default=str).encode() if doc is not None else b"{}"
                self.send_response(200 if doc is not None else 503 if self.path == PATH else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_UNIX
            daemon_threads = True

            def server_bind(self):
                self.socket.bind(self.server_address)

            def get_request(self):
                conn, _ = self.socket.accept()
                return conn, ("local", 0)

        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        self._httpd = Server(str(path), Handler)
        os.chmod(path, 0o666)  # pods mount the state dir to ask; the socket answers reads only
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="gpuwarden-agent-socket", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        try:
            self.path.unlink()
        except OSError:
            pass
