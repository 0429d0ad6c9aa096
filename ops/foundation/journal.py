"""Append-only journal of every action that changes the node: who, when, what, result.

One JSON object per line in <state dir>/journal.log, appended under flock so lines never interleave;
every value is redacted as it is written (an engine's argv keeps no password), and reading skips lines
that are not gpuwarden's (not UTF-8, not JSON objects) and says how many.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from gpuwarden.ops.foundation import redact, safetext, statedir, statefiles

MAX_LINE = 1 << 20  # an entry is a few hundred bytes; a longer line is not one of ours
TAIL_BYTES_PER_ENTRY = 16 << 10


def who() -> str:
    """The operator: the user name, and the sudo user behind it when there is one."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry (containers): KeyError before 3.13, OSError after
        user = str(os.geteuid())
    sudo = os.environ.get("SUDO_USER")
    return f"{user} (sudo from {sudo})" if sudo and sudo != user else user


FLEET_ORIGIN_ENV = "GPUWARDEN_FLEET_ORIGIN"


def fleet_origin() -> dict[str, str]:
    """`via` and the operator behind it when `gpuwarden fleet` started this command over SSH (empty otherwise).

    The SSH login ("who") stays the authority; this says which console operator asked, for the record."""
    clean = safetext.printable(os.environ.get(FLEET_ORIGIN_ENV, ""))[:200]
    return {"via": "fleet", "operator": clean} if clean else {}


def write(state_dir: Path, action: str, result: str, **details: Any) -> dict[str, Any]:
    """Append one entry and return it (as written: redacted). `result` is e.g. "ok", "failed", "started"."""
    entry = {
        "ts": time.time(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "who": who(),
        "pid": os.getpid(),
        "action": action,
        "result": result,
        **fleet_origin(),
        **redact.value(json.loads(json.dumps(details, default=str))),
    }
    line = json.dumps(entry, default=str, sort_keys=False) + "\n"
    with statedir.open_dir(state_dir, create=True) as d:
        d.append(statedir.JOURNAL, line.encode(), lock=True)
    return entry


@dataclass
class Read:
    entries: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # lines that are not journal entries (corrupt, truncated, planted)
    end: tuple[int, int] | None = None  # (inode, offset) read up to: where a follower goes on from


def read_checked(state_dir: Path, limit: int | None = None) -> Read:
    """Entries oldest first (the last `limit` when given), and how many lines were not entries."""
    out = Read()
    try:
        d = statedir.open_dir(state_dir)
    except FileNotFoundError:
        return out
    with d:
        try:
            fd = d.open(statedir.JOURNAL)
        except FileNotFoundError:
            return out
        try:
            if limit is not None:
                # Only the end is wanted: read back far enough for `limit` entries, never the whole file.
                size = os.fstat(fd).st_size
                start = max(0, size - (limit + 1) * TAIL_BYTES_PER_ENTRY)
                os.lseek(fd, start, os.SEEK_SET)
                tail = list(statedir.walk_lines(fd, MAX_LINE))
                if start > 0 and tail:
                    tail = tail[1:]  # the first line read is probably cut
                lines: Iterable[bytes] = tail[-limit:] if limit else []
            else:
                lines = statedir.walk_lines(fd, MAX_LINE)
            for raw in lines:
                entry = parse_line(raw)
                if entry is None:
                    out.skipped += 1
                else:
                    out.entries.append(entry)
            out.end = (os.fstat(fd).st_ino, os.lseek(fd, 0, os.SEEK_CUR))
        finally:
            os.close(fd)
    return out


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """One journal line as its entry; None when it is not one of ours (also for readers that follow the file)."""
    if not raw.strip():
        return None
    try:
        value: dict[str, Any] = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if statefiles.problem(value, statefiles.JOURNAL_ENTRY):
        return None
    return value


def read(state_dir: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Entries oldest first (the last `limit` when given); lines that are not entries are skipped."""
    return read_checked(state_dir, limit).entries


def follow(state_dir: Path, *, start: tuple[int, int] | None = None, poll_s: float = 0.5,
           keep_going: Callable[[], bool] = lambda: True) -> Iterator[dict[str, Any]]:
    """Entries as they are written (`journal -f`), across a rotated or truncated file: from `start` (a
    read_checked's end, so nothing written in between is lost), else from the end as it is now.

    Lines that are not entries are passed over, as read_checked counts them."""
    fd: int | None = None
    partial = b""
    try:
        fd = _open_journal(state_dir)
        if fd is not None:
            same = start is not None and os.fstat(fd).st_ino == start[0]
            if start is None or same:
                os.lseek(fd, start[1] if start is not None and same else 0, os.SEEK_SET if same else os.SEEK_END)
        while keep_going():
            if fd is None:
                fd = _open_journal(state_dir)
                if fd is None:
                    time.sleep(poll_s)
                    continue
            chunk = os.read(fd, 1 << 20)
            if chunk:
                partial += chunk
                *lines, partial = partial.split(b"\n")
                for raw in lines:
                    entry = parse_line(raw)
                    if entry is not None:
                        yield entry
                if len(partial) > MAX_LINE:
                    partial = b""  # no entry is this long: skip to the next newline
                continue
            try:
                st, now = os.stat(state_dir / statedir.JOURNAL), os.fstat(fd)
                replaced = st.st_ino != now.st_ino or st.st_size < os.lseek(fd, 0, os.SEEK_CUR)
            except FileNotFoundError:
                replaced = True
            if replaced:  # rotated or truncated: the new file from its start
                os.close(fd)
                fd, partial = None, b""
                continue
            time.sleep(poll_s)
    finally:
        if fd is not None:
            os.close(fd)


def _open_journal(state_dir: Path) -> int | None:
    try:
        with statedir.open_dir(state_dir) as d:
            return d.open(statedir.JOURNAL)
    except FileNotFoundError:
        return None
