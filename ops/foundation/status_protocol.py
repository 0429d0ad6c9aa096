"""The engine status protocol: JSON lines an engine writes to say which phase it is in.

The shim names a file (GPUWARDEN_STATUS_FILE) or an inherited fd (GPUWARDEN_STATUS_FD);
an engine appends one object per line, e.g. {"phase": "registered", "bytes": 34359738368}.
A C++ engine needs five lines: getenv, fopen(path, "a"), fprintf, fflush, fclose.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuwarden.ops.foundation import inputs
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.records import field, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Iterator, Mapping

ENV_FILE = "GPUWARDEN_STATUS_FILE"
ENV_FD = "GPUWARDEN_STATUS_FD"

# The phases gpuwarden understands, in the order an engine moves through them.
PHASES = ("starting", "mapping", "verifying", "registering", "registered", "serving", "stopping", "exited")


@record
class StatusEvent:
    phase: str
    ts: float
    data: dict[str, Any] = field(default_factory=dict)


class StatusWriter:
    """Writes status events where the environment says; silently does nothing when it says nothing."""

    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self._fd: int | None = None
        self._own_fd = False
        if env.get(ENV_FD):
            try:
                self._fd = int(env[ENV_FD])
                os.fstat(self._fd)
            except (ValueError, OSError):
                self._fd = None
        if self._fd is None and env.get(ENV_FILE):
            self._fd = os.open(env[ENV_FILE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._own_fd = True

    @property
    def active(self) -> bool:
        return self._fd is not None

    def emit(self, phase: str, **data: Any) -> None:
        if self._fd is None:
            return
        line = json.dumps({"phase": phase, "ts": time.time(), "pid": os.getpid(), **data}, default=str)
        # One write() per line: O_APPEND makes it atomic for lines under PIPE_BUF with other writers.
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        if self._fd is not None and self._own_fd:
            os.close(self._fd)
        self._fd = None


def parse_line(line: str, arrived: float | None = None) -> StatusEvent | None:
    """One protocol line to an event; None for anything that is not a JSON object with a phase."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("phase"), str):
        return None
    phase = obj.pop("phase")
    ts = obj.pop("ts", None)
    if not isinstance(ts, (int, float)):
        ts = arrived if arrived is not None else time.time()
    return StatusEvent(phase=phase, ts=float(ts), data=obj)


MAX_READ = 4 << 20  # the tail of a status file that is read; an engine writes a few lines per run


def read_events(path: Path) -> list[StatusEvent]:
    """Every event in a status file (its last MAX_READ bytes), in file order; a missing or unusable file
    (a FIFO or device named by an engine's environment) has none."""
    try:
        got = inputs.tail_regular(path, MAX_READ, "status file")
    except GpuwardenError:
        return []
    if got is None:
        return []
    text = got[0].decode(errors="replace")
    return [e for e in (parse_line(line) for line in text.splitlines()) if e is not None]


class StatusFollower:
    """Reads new complete lines from a status file as it grows (the shim calls poll())."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""

    def poll(self) -> Iterator[StatusEvent]:
        try:
            fd = inputs.open_regular(self.path, "status file")
        except GpuwardenError:
            return
        try:
            chunk = os.pread(fd, MAX_READ, self._offset)
        finally:
            os.close(fd)
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()[-65536:]  # no protocol line is that long; keep memory bounded
        now = time.time()
        for raw in lines:
            event = parse_line(raw.decode(errors="replace"), arrived=now)
            if event is not None:
                yield event
