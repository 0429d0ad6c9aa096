"""Asking the local agent over its unix socket, with nothing heavier than `socket` imported.

get() returns None when no agent answers (no socket, nobody listening, no permission, no answer in time).
Whether a command's snapshot comes from the agent at all is ops/sources/choose.py's to decide; bundles take the
agent's latest through snapshot(). Nothing here imports the rest of the agent: any layer may use it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuwarden.ops.foundation.paths import AGENT_SOCKET

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` asks the agent through here
if TYPE_CHECKING:
    import socket
    from typing import Any

TIMEOUT_S = 2.0
_FULL_QUEUE_RETRY_S = 0.01  # how soon a connect that met a full listen queue tries again
SNAPSHOT = "/v1/snapshot"


class Reply:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> dict[str, Any]:
        """The body's JSON document; ValueError when it is not JSON or not an object (every agent reply is one)."""
        doc = json.loads(self.body)
        if not isinstance(doc, dict):
            raise ValueError(f"the agent answered a JSON {type(doc).__name__}, not a document")
        return doc


def connect(sock_path: Path | str, timeout: float = TIMEOUT_S) -> socket.socket:
    """A unix stream socket connected to `sock_path`, each operation on it bounded by `timeout`. A full listen
    queue is waited on, up to `timeout`: a unix connect meets it with EAGAIN at once (TCP would retry its SYN),
    and a crowd of connections must not make a listening agent look absent. OSError when none is made."""
    # deferred: keeps `gpuwarden status --json` cheap (2.5 ms there)
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                s.connect(str(sock_path))
                return s
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{sock_path}: its listen queue stayed full for {timeout:g} s") from None
                time.sleep(min(_FULL_QUEUE_RETRY_S, left))
    except BaseException:
        s.close()
        raise


def get(sock_path: Path | str, target: str, timeout: float = TIMEOUT_S) -> Reply | None:
    """GET `target` (e.g. "/v1/snapshot") from the agent at `sock_path`; None when no agent answers."""
    try:
        os.stat(sock_path)
    except OSError:
        return None  # no agent here: not even worth importing socket
    try:
        s = connect(sock_path, timeout)
    except OSError:  # nobody listening, no permission, its queue full past the timeout
        return None
    try:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n".encode())
        got = _read_answer(s)
    except OSError:  # the agent went, or did not answer in time
        return None
    finally:
        s.close()
    if got is None:
        return None
    head, body = got
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(parts[1]), headers, body)


def _read_answer(s: socket.socket) -> tuple[bytes, bytes] | None:
    """(head, body) of the answer on `s`: the head read in chunks, then a body of the Content-Length it names
    read straight into one buffer (a big node's snapshot is ~1 MB: no list of chunks joined, then split);
    without a length, up to the end of the stream. None when the head never ends."""
    data = s.recv(1 << 16)
    while b"\r\n\r\n" not in data:
        more = s.recv(1 << 16)
        if not more:
            return None
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = int(value)
    if length is None or length < len(rest):
        chunks = [rest]
        while True:
            more = s.recv(1 << 20)
            if not more:
                break
            chunks.append(more)
        return head, b"".join(chunks)
    body = bytearray(length)
    view = memoryview(body)
    view[:len(rest)] = rest
    at = len(rest)
    while at < length:
        n = s.recv_into(view[at:])
        if not n:
            break  # the agent hung up early: what came is what there is
        at += n
    return head, bytes(view[:at])  # callers get bytes (hashable, what Reply promises): one copy


def snapshot(state_dir: Path, backend: str | None = None, timeout: float = TIMEOUT_S) -> Reply | None:
    """The agent's latest snapshot reply for this state dir; None when no agent answers it with 200, or when
    `backend` names another source than the one the agent samples (the caller then samples that one itself)."""
    reply = get(Path(state_dir) / AGENT_SOCKET, SNAPSHOT, timeout)
    if reply is None or reply.status != 200:
        return None
    if backend and backend != "auto" and reply.headers.get("x-gpuwarden-backend") != backend:
        return None
    return reply
