"""Shared-by-descriptor mode: one keeper allocates host memory once and hands its descriptor to importers.

The keeper listens on a unix socket and sends each connecting importer one JSON line with an SCM_RIGHTS fd.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from gpuwarden.ops.foundation.errors import GpuwardenError

PROTOCOL = 1
JOIN_TIMEOUT_S = 10.0


class ShareFailed(GpuwardenError):
    """The descriptor could not be created, passed, imported or mapped."""


@dataclass
class Shared:
    """One mapping of the shared allocation in this process; `address` is what the runtime's copies take."""

    runtime: str
    fd: int
    size: int
    address: int
    seconds: float = 0.0
    keeper: bool = False
    payload: int | None = None  # the arena's bytes within the (granularity-rounded) mapping; None: all of it
    handles: dict[str, object] = field(default_factory=dict)  # runtime-private (handle, mmap, ...)


def _no_keeper_hint(path: str) -> str:
    return (f"start one: python -m gpuwarden.ops.canary --share keeper --share-socket {path} --arena ARENA; "
            "engines that already joined keep their mappings meanwhile")


class Keeper:
    """The keeper's listening socket; serve() passes the descriptor to whoever connects, without blocking."""

    def __init__(self, path: str, fd: int, meta: Mapping[str, object]) -> None:
        self.path = path
        self.fd = fd
        self.meta = {"protocol": PROTOCOL, **meta}
        self.served = 0
        self._claim(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)  # the fd grants the whole arena: only this user may join
        self.sock.listen(16)
        self.sock.settimeout(0.0)

    @staticmethod
    def _claim(path: str) -> None:
        """Remove a dead keeper's socket; refuse when a live keeper still answers on it."""
        if not os.path.exists(path):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # nobody listens: a previous keeper died without cleaning up
            return
        except OSError as exc:
            raise ShareFailed(f"cannot check the keeper socket {path}: {exc.strerror}",
                              "remove it if no keeper runs, or choose another --share-socket") from None
        finally:
            probe.close()
        raise ShareFailed(f"a keeper is already serving at {path}",
                          "importers can join it (--share import); stop it first to start another")

    def serve(self) -> int:
        """Answer every importer waiting now; returns how many were served."""
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return n
            try:
                conn.settimeout(JOIN_TIMEOUT_S)
                line = (json.dumps(self.meta) + "\n").encode()
                socket.send_fds(conn, [line], [self.fd])
                n += 1
                self.served += 1
            except OSError:
                pass  # an importer that hung up mid-join gets nothing; the next one is unaffected
            finally:
                conn.close()

    def close(self) -> None:
        self.sock.close()
        try:
            if os.path.exists(self.path):
                os.unlink(self.path)
        except OSError:
            pass


def join(path: str, timeout_s: float = JOIN_TIMEOUT_S) -> tuple[int, dict[str, object]]:
    """Connect to the keeper at `path`; return (descriptor, keeper's description). One ShareFailed line otherwise."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        try:
            sock.connect(path)
        except FileNotFoundError:
            raise ShareFailed(f"no keeper is serving at {path} (the socket does not exist)", _no_keeper_hint(path)) from None
        except ConnectionRefusedError:
            raise ShareFailed(f"no keeper is serving at {path} (it exited; its socket is left over)",
                              _no_keeper_hint(path)) from None
        except OSError as exc:
            raise ShareFailed(f"cannot reach the keeper at {path}: {exc.strerror}", _no_keeper_hint(path)) from None
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 65536, 1)
        except socket.timeout:
            raise ShareFailed(f"the keeper at {path} did not answer within {timeout_s:g}s",
                              "it may be hung: check it with `gpuwarden status`, restart it") from None
        except OSError as exc:
            if exc.errno == errno.ECONNRESET:
                raise ShareFailed(f"the keeper at {path} hung up before passing the descriptor",
                                  _no_keeper_hint(path)) from None
            raise ShareFailed(f"receiving from the keeper at {path} failed: {exc.strerror}", _no_keeper_hint(path)) from None
    finally:
        sock.close()
    if not fds:
        raise ShareFailed(f"the keeper at {path} sent no descriptor", _no_keeper_hint(path))
    try:
        meta = json.loads(msg.decode())
    except (UnicodeDecodeError, ValueError):
        for fd in fds:
            os.close(fd)
        raise ShareFailed(f"the keeper at {path} sent an unreadable description", "is it a gpuwarden keeper?") from None
    for extra in fds[1:]:
        os.close(extra)
    if meta.get("protocol") != PROTOCOL:
        os.close(fds[0])
        raise ShareFailed(f"the keeper at {path} speaks protocol {meta.get('protocol')!r}, this canary {PROTOCOL}",
                          "run the keeper and the importers from the same gpuwarden version")
    return fds[0], meta
