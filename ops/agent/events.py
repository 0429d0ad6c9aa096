"""The agent's event log: every node event with a sequence number, kept in memory for the API and appended to
<state dir>/agent/events.jsonl (rotated at a size limit, one older file kept), so it outlives a restart.

Readers ask for events after a sequence number or a time; wait() lets a streaming client sleep until one comes.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

from gpuwarden.ops.foundation.jsondoc import iso
from gpuwarden.ops.sampling.changes import NodeEvent
from gpuwarden.ops.agent import jsonlines
from gpuwarden.ops.agent.writewatch import WriteWatch, ignore

FILE = "events.jsonl"
OLD = "events.1.jsonl"
KEEP_IN_MEMORY = 10000


def record(seq: int, event: NodeEvent) -> dict[str, Any]:
    """An event as the log, the API and `gpuwarden history --json` carry it."""
    return {"seq": seq, "ts": event.ts, "ts_iso": iso(event.ts), "level": event.level, "kind": event.kind,
            "gpu": event.gpu, "text": event.text, "data": event.data}


class EventLog:
    def __init__(self, directory: Path | None, max_bytes: int = 16 << 20, keep: int = KEEP_IN_MEMORY,
                 watch: WriteWatch | None = None):
        self.dir = directory
        self.watch = watch or ignore()
        self.max_bytes = max_bytes
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._cond = threading.Condition()
        self._seq = 0
        self._file: jsonlines.Appender | None = None
        if directory is not None:
            for path in (directory / OLD, directory / FILE):
                for rec in jsonlines.read(path):
                    if isinstance(rec.get("seq"), int) and isinstance(rec.get("ts"), (int, float)):
                        self._recent.append(rec)
                        self._seq = max(self._seq, rec["seq"])
            self._file = jsonlines.Appender(directory / FILE)

    @property
    def last_seq(self) -> int:
        return self._seq

    def append(self, event: NodeEvent) -> dict[str, Any]:
        with self._cond:
            self._seq += 1
            rec = record(self._seq, event)
            self._recent.append(rec)
            self._write(rec)
            self._cond.notify_all()
        return rec

    def _write(self, rec: dict[str, Any]) -> None:
        if self._file is None:
            return
        try:
            self._file.append(rec)
            if self._file.size() > self.max_bytes:
                self._rotate()
        except OSError as exc:  # a full disk loses the file copy, never the in-memory log or the sampling
            self.watch.failed("event log", self._file.path, exc)
            return
        self.watch.ok("event log")

    def _rotate(self) -> None:
        assert self.dir is not None and self._file is not None
        self._file.close()
        os.replace(self.dir / FILE, self.dir / OLD)
        self._file = jsonlines.Appender(self.dir / FILE)

    def since(self, seq: int | None = None, ts: float | None = None, limit: int = 1000,
              gpu: int | None = None) -> list[dict[str, Any]]:
        """Events after sequence number `seq` (or at/after time `ts`), oldest first, at most `limit` (the newest)."""
        with self._cond:
            items = list(self._recent)
        out = [r for r in items if (seq is None or r["seq"] > seq) and (ts is None or r["ts"] >= ts)
               and (gpu is None or r.get("gpu") == gpu)]
        return out[-limit:] if limit else out

    def wait(self, after_seq: int, timeout: float) -> list[dict[str, Any]]:
        """Events after `after_seq`, waiting up to `timeout` seconds for the first one."""
        with self._cond:
            if self._seq <= after_seq:
                self._cond.wait(timeout)
        return self.since(after_seq)

    def close(self) -> None:
        with self._cond:
            if self._file is not None:
                self._file.close()
                self._file = None
            self._cond.notify_all()


def read_files(directory: Path) -> list[dict[str, Any]]:
    """The persisted events of a stopped agent, oldest first."""
    out: list[dict[str, Any]] = []
    for path in (directory / OLD, directory / FILE):
        out.extend(r for r in jsonlines.read(path) if isinstance(r.get("seq"), int))
    return out
