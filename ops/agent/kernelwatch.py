"""The agent's kernel-log watch: follow /dev/kmsg (else `journalctl -k -f`, or a file/FIFO named in the config),
run new lines through the triage rules in small batches, and turn each new finding into a node event.

Triage is called in one place, TriageAdapter.feed(), through the streaming gpuwarden.ops.triage.live.LiveTriage.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from gpuwarden.ops.sampling.changes import NodeEvent
from gpuwarden.ops.foundation.waitfd import WakePipe, readable
from gpuwarden.ops.agent.writewatch import WriteWatch, ignore
from gpuwarden.ops.triage.findings import Finding
from gpuwarden.ops.triage.live import LiveTriage
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.statedir import atomic_write

KMSG = "/dev/kmsg"
# A /dev/kmsg record: "PRI,SEQ,USEC,FLAGS[,more];message" (Documentation/ABI/testing/dev-kmsg).
_KMSG_RECORD = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_KMSG_DICT = re.compile(r"^ [A-Z][A-Z0-9_]*=")
BATCH_S = 0.5  # lines arriving within this are triaged together (a multi-line report stays whole)
BATCH_LINES = 400
REPEAT_S = 60.0  # the same finding (rule + signature) is one event per this many seconds
# Finding categories that count as a kernel fault for the bundle_on = ["kernel-fault"] policy.
FAULT_CATEGORIES = ("gpu-page-fault", "ring-timeout", "gpu-reset", "xid", "segfault", "ras", "mes-kiq")
_SEVERITY_LEVEL = {"critical": "error", "error": "error", "warning": "warning"}


def useful(line: str) -> bool:
    """False for what triage must not see: a /dev/kmsg record's dictionary line (" SUBSYSTEM=pci"), blank lines."""
    return bool(line.strip()) and not _KMSG_DICT.match(line)


@dataclass
class _Seen:
    at: float  # when the last event for it went out
    count: int  # the finding's count then


class TriageAdapter:
    """Lines in, new kernel findings out (as plain dicts): the one caller of gpuwarden.ops.triage in the agent.

    One LiveTriage is kept across batches, so a multi-line report split between two reads stays one finding."""

    def __init__(self, repeat_s: float = REPEAT_S):
        self.repeat_s = repeat_s
        self._live: LiveTriage | None = None
        self._seen: dict[tuple[str, str], _Seen] = {}

    def feed(self, lines: list[str], gpu_pids: set[int] | None = None, now: float | None = None) -> list[dict[str, Any]]:
        live = self._live
        if live is None:
            live = self._live = LiveTriage("kernel log (agent)")
        now = time.time() if now is None else now
        changed: dict[tuple[str, str], Finding] = {}
        for line in lines:
            found = live.feed_kmsg(line) if _KMSG_RECORD.match(line) else live.feed(line)
            for f in found:
                changed[(f.rule, f.signature)] = f
        out = []
        for key, f in changed.items():
            if f.severity not in _SEVERITY_LEVEL or f.rule == "unclassified":
                continue
            if f.category == "oom":
                # An OOM kill matters here only when it hit a GPU process.
                pids = {v.get("pid") for v in f.victims}
                if gpu_pids is None or not pids & gpu_pids:
                    continue
            seen = self._seen.get(key)
            if seen is not None and (now - seen.at < self.repeat_s or f.count == seen.count):
                continue  # the same finding again: its count grows, one event a minute at most
            self._seen[key] = _Seen(now, f.count)
            out.append({"rule": f.rule, "category": f.category, "severity": f.severity, "title": f.title,
                        "signature": f.signature, "count": f.count,
                        "new_since_last_event": f.count - (seen.count if seen is not None else 0),
                        "devices": list(f.devices), "victims": f.victims[:8], "example": (f.examples or [""])[0]})
        if len(self._seen) > 4096:  # bounded: forget the signatures not reported for longest
            for key in sorted(self._seen, key=lambda k: self._seen[k].at)[:1024]:
                del self._seen[key]
        return out


def finding_event(finding: dict[str, Any], ts: float) -> NodeEvent:
    return NodeEvent(ts, _SEVERITY_LEVEL.get(finding["severity"], "warning"), f"kernel: {finding['title']}",
                     "kernel", None, finding)


class _Lines(Protocol):
    """A kernel log source: read() gives the new lines ([] when none came within `timeout`, None at its end)."""

    def read(self, timeout: float | None, wake: int | None = None) -> list[str] | None: ...
    def close(self) -> None: ...


class KernelWatch:
    """A thread that reads kernel log lines from `source` and calls emit(NodeEvent) for each new finding.

    source: "auto", "off", or a path (a FIFO, or a regular file followed like `tail -f`)."""

    def __init__(self, source: str, emit: Callable[[NodeEvent], object], *, gpu_pids: Callable[[], set[int]] = set,
                 state_file: Path | None = None, adapter: TriageAdapter | None = None,
                 watch: WriteWatch | None = None):
        self.source = source
        self.watch = watch or ignore()  # the state file's writes: a read-only state dir is said once, not fatal
        self.emit = emit
        self.gpu_pids = gpu_pids
        self.state_file = state_file  # remembers the last /dev/kmsg sequence number across restarts
        self.adapter = adapter or TriageAdapter()
        self.describe = "off"
        self.lines_read = 0
        self._stop = threading.Event()
        # stop() writes here: the thread sleeps on the kernel log until a line comes (it used to wake every BATCH_S
        # to look at the stop flag: 0.19 ms/s of an idle agent).
        self._wake = WakePipe()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Open the source and start following it; returns what it follows (or why not), for the log."""
        if self.source == "off":
            return "kernel log watch off"
        reader = self._open()
        if reader is None:
            return self.describe
        self._thread = threading.Thread(target=self._run, args=(reader,), name="gpuwarden-kmsg", daemon=True)
        self._thread.start()
        return f"following {self.describe}"

    def stop(self) -> None:
        self._stop.set()
        self._wake.wake()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        if self._thread is not None:
            self._thread.join(1.0)  # woken by the pipe (a regular file source looks at the flag 5 times a second)
        if self._thread is None or not self._thread.is_alive():
            self._wake.close()

    # --- sources --------------------------------------------------------------------------------
    def _open(self) -> _Lines | None:
        if self.source != "auto":
            path = Path(self.source)
            try:
                # A FIFO opened for writing too never reads end-of-file between two writers.
                mode = os.O_RDWR if path.is_fifo() else os.O_RDONLY
                fd = os.open(path, mode | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self.describe = f"kernel log watch off: cannot open {path} ({exc.strerror})"
                return None
            self.describe = str(path)
            return _FileLines(fd, path)
        try:
            fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            why = exc.strerror
        else:
            self.describe = KMSG
            return _KmsgRecords(fd, self.state_file, self.watch)
        journalctl = shutil.which("journalctl")
        if journalctl is None:
            self.describe = f"kernel log watch off: cannot read {KMSG} ({why}) and no journalctl"
            return None
        try:
            proc = self._proc = subprocess.Popen(
                [journalctl, "-k", "-f", "-n", "0", "-o", "short-iso", "--no-pager"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except OSError as exc:
            self.describe = f"kernel log watch off: {KMSG}: {why}; journalctl: {exc.strerror}"
            return None
        self.describe = f"journalctl -k -f ({KMSG}: {why})"
        assert proc.stdout is not None  # stdout=PIPE
        os.set_blocking(proc.stdout.fileno(), False)
        return _FileLines(proc.stdout.fileno(), None)

    # --- the loop -------------------------------------------------------------------------------
    def _run(self, reader: _Lines) -> None:
        batch: list[str] = []
        first = 0.0
        try:
            while not self._stop.is_set():
                # Nothing pending: asleep until a line comes or stop() wakes it; else until the batch is due.
                lines = reader.read(None if not batch else max(0.0, first + BATCH_S - time.monotonic()), self._wake.fd)
                if lines is None:
                    break  # the source ended (a FIFO's writer went away and will not come back is fine too)
                if lines and not batch:
                    first = time.monotonic()
                batch.extend(lines)
                if batch and (len(batch) >= BATCH_LINES or time.monotonic() - first >= BATCH_S):
                    self._triage(batch)
                    batch = []
            if batch:
                self._triage(batch)
        finally:
            reader.close()

    def _triage(self, lines: list[str]) -> None:
        self.lines_read += len(lines)
        try:
            findings = self.adapter.feed(lines, self.gpu_pids())
        except Exception as exc:  # a triage bug must not end the watch
            self.emit(NodeEvent(time.time(), "warning", f"kernel log watch: triage failed: {exc}", "agent"))
            return
        now = time.time()
        for f in findings:
            self.emit(finding_event(f, now))


class _KmsgRecords:
    """Records from /dev/kmsg, converted to dmesg lines; resumes after the last sequence number seen."""

    def __init__(self, fd: int, state_file: Path | None, watch: WriteWatch | None = None):
        self.fd = fd
        self.state_file = state_file
        self.watch = watch or ignore()
        self.last_seq = self._saved_seq()
        if self.last_seq is None:
            os.lseek(fd, 0, os.SEEK_END)  # first run: the boot's old messages are not news

    def _saved_seq(self) -> int | None:
        try:
            return int(self.state_file.read_text()) if self.state_file else None
        except (OSError, ValueError):
            return None

    def read(self, timeout: float | None, wake: int | None = None) -> list[str] | None:
        if not readable(self.fd, timeout, wake):
            return []
        out: list[str] = []
        while len(out) < BATCH_LINES:
            try:
                raw = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them: go on with the next ones
                raise
            record = raw.decode(errors="replace")
            m = _KMSG_RECORD.match(record.split("\n", 1)[0])
            if m is not None:
                seq = int(m["seq"])
                if self.last_seq is not None and seq <= self.last_seq:
                    continue
                self.last_seq = seq
            line = record.split("\n", 1)[0]
            if useful(line):
                out.append(line)
        if out and self.state_file is not None and self.last_seq is not None:
            try:
                atomic_write(self.state_file, str(self.last_seq), 0o600, root=self.state_file.parent)
            except (OSError, GpuwardenError) as exc:  # statedir's open errors are GpuwardenErrors
                # The watch goes on (a restart may show a few lines twice); it used to die here, with a traceback.
                self.watch.failed("kernel log position", self.state_file, exc)
            else:
                self.watch.ok("kernel log position")
        return out

    def close(self) -> None:
        os.close(self.fd)


class _FileLines:
    """Lines from a FIFO, a pipe or a regular file that grows (followed from where it ends at start)."""

    def __init__(self, fd: int, path: Path | None):
        self.fd = fd
        self.path = path
        self.buf = b""
        self.regular = False
        try:
            self.regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            pass
        if self.regular:
            os.lseek(fd, 0, os.SEEK_END)

    def read(self, timeout: float | None, wake: int | None = None) -> list[str] | None:
        if self.regular:
            # A growing regular file cannot be waited on: look 5 times a second (or sooner, woken to stop).
            pause = 0.2 if timeout is None else min(timeout, 0.2)
            if pause > 0 and wake is not None:
                readable(wake, pause)
            elif pause > 0:
                time.sleep(pause)
        else:
            if not readable(self.fd, timeout, wake):
                return []
        chunks: list[bytes] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                if not self.regular and not chunks:
                    return None  # a pipe whose writer is gone (journalctl ended)
                break
            chunks.append(data)
        self.buf += b"".join(chunks)
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for raw in lines:
            line = raw.decode(errors="replace")
            if useful(line):
                out.append(line)
        return out

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
