"""The agent's gpu-check gate: an unprivileged init container asks over the network whether its pod's GPUs are clean.

The caller proves which pod it is with its projected service-account token (audience gpuwarden), verified by a
TokenReview; the pod's GPUs come from the kubelet's pod-resources API, never from what the caller says.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.k8s.kube import Kube, KubeError

PATH = "/v1/gpu-check"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
NODE_NAME = "authentication.kubernetes.io/node-name"
SA_PREFIX = "system:serviceaccount:"
MAX_BODY = 4096
TOKEN_CACHE_S = 60.0
TOKEN_CACHE_MAX = 512
REFUSED_CACHE_S = 10.0  # a refused token is not sent to the API server again for this long
REVIEWS_PER_S = 20.0  # TokenReviews a second at most: any pod can reach the port, none may flood the API server


@dataclass(frozen=True)
class Caller:
    namespace: str
    pod: str
    pod_uid: str | None


@dataclass(frozen=True)
class Verdict:
    ok: bool
    gpus: tuple[int, ...]
    reason: str  # one line: why not (or "clean")


Judge = Callable[[Caller], Verdict]


class Refused(Exception):
    """An answer that is not a verdict: HTTP status and one line."""

    def __init__(self, status: int, line: str):
        super().__init__(line)
        self.status, self.line = status, line


class TokenVerifier:
    """TokenReview with the gate's audience; a verified token is remembered briefly (init containers retry)."""

    def __init__(self, kube: Kube, node: str, audience: str, clock: Callable[[], float] = time.monotonic):
        self.kube, self.node, self.audience, self.clock = kube, node, audience, clock
        self._cache: dict[str, tuple[float, Caller | Refused]] = {}
        self._lock = threading.Lock()
        self._budget, self._budget_at = REVIEWS_PER_S, clock()

    def caller(self, token: str) -> Caller:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(token)
            if hit is not None and now - hit[0] < (REFUSED_CACHE_S if isinstance(hit[1], Refused) else TOKEN_CACHE_S):
                if isinstance(hit[1], Refused):
                    raise hit[1]
                return hit[1]
            self._budget = min(REVIEWS_PER_S, self._budget + (now - self._budget_at) * REVIEWS_PER_S)
            self._budget_at = now
            if self._budget < 1.0:
                raise Refused(429, "too many token checks at once: try again in a second")
            self._budget -= 1.0
        try:
            caller = self._review(token)
        except Refused as exc:
            if exc.status in (401, 403):
                self._remember(token, now, exc)
            raise
        self._remember(token, now, caller)
        return caller

    def _remember(self, token: str, now: float, what: Caller | Refused) -> None:
        with self._lock:
            if len(self._cache) >= TOKEN_CACHE_MAX:
                self._cache.clear()
            self._cache[token] = (now, what)

    def _review(self, token: str) -> Caller:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]}}
        try:
            review = self.kube.create_cluster("create a tokenreview", "authentication.k8s.io/v1", "TokenReview",
                                              "tokenreviews", body)
        except KubeError as exc:
            raise Refused(503, f"the agent cannot verify tokens now: {exc.message}") from None
        status = review.get("status") or {}
        if not status.get("authenticated"):
            raise Refused(401, f"token refused: {status.get('error') or 'not authenticated'} (send the pod's projected "
                               f"service-account token for audience {self.audience!r})")
        user = status.get("user") or {}
        name, extra = str(user.get("username", "")), user.get("extra") or {}
        if not name.startswith(SA_PREFIX) or not extra.get(POD_NAME):
            raise Refused(403, f"{name or 'the caller'} is not a pod's bound service-account token")
        node = (extra.get(NODE_NAME) or [None])[0]
        if node is not None and node != self.node:
            raise Refused(403, f"the token's pod runs on node {node}, not {self.node}: ask that node's agent")
        return Caller(name[len(SA_PREFIX):].split(":", 1)[0], extra[POD_NAME][0], (extra.get(POD_UID) or [None])[0])


class Gate:
    """The HTTP listener: POST /v1/gpu-check with `Authorization: Bearer <token>` -> a JSON verdict."""

    def __init__(self, listen: str, verifier: TokenVerifier, judge: Judge,
                 log: Callable[[str, str], None] = lambda level, text: None):
        host, _, port = listen.rpartition(":")
        if not port.isdigit():
            raise GpuwardenError(f"gate_listen {listen!r} is not HOST:PORT", 'e.g. gate_listen = "0.0.0.0:9836"')
        self.verifier, self.judge, self.log = verifier, judge, log
        self.answered = 0
        try:
            self.httpd = ThreadingHTTPServer((host or "0.0.0.0", int(port)), _handler(self))
        except OSError as exc:
            raise GpuwardenError(f"cannot listen on {listen} for the gpu-check gate: {exc.strerror}",
                                 "choose a free port with [kubernetes] gate_listen (and the DaemonSet's hostPort)") from None
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="gpuwarden-gate", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, authorization: str) -> tuple[int, dict[str, Any]]:
        scheme, _, token = authorization.partition(" ")
        try:
            if scheme.lower() != "bearer" or not token.strip():
                raise Refused(401, "no token: send `Authorization: Bearer <the pod's projected token>`")
            caller = self.verifier.caller(token.strip())
            verdict = self.judge(caller)
        except Refused as exc:
            return exc.status, {"ok": False, "reason": exc.line}
        self.answered += 1
        pod = f"{caller.namespace}/{caller.pod}"
        if not verdict.ok:
            self.log("warning", f"kubernetes: gpu-check refused pod {pod}: {verdict.reason}")
        return 200, {"ok": verdict.ok, "pod": pod, "gpus": list(verdict.gpus), "reason": verdict.reason}


def _handler(gate: Gate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 5.0  # a client that sends nothing does not hold a thread

        def log_message(self, *args: Any) -> None:  # refusals go to the agent's log as one line each
            pass

        def _send(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != PATH:
                self._send(404, {"ok": False, "reason": f"no such path: POST {PATH}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._send(413, {"ok": False, "reason": "request too large"})
                return
            if length:
                self.rfile.read(length)  # nothing in the body is trusted: the token says who asks
            self._send(*gate.answer(self.headers.get("Authorization", "")))

        def do_GET(self) -> None:
            self._send(405, {"ok": False, "reason": f"use POST {PATH}"})

    return Handler
