"""Feed a log of any size to the analyzer in bounded memory, skipping lines that cannot matter.

The file is read in chunks. One prefilter (every literal some rule requires, case-insensitive) runs over
each chunk in C (RE2 when the google-re2 wheel is there: linear time whatever the input; Python's re
otherwise) and finds the candidate lines; only those, and the lines an open detail window or a possible
continuation wants, reach Python code. What a skipped line would have told the analyzer about the lines
after it is handed over too (the GPU a driver line names; the header an indented continuation extends), so
the report is the one reading every line gives. A line longer than logline.MAX_LINE is cut, and a line with
no newline at all is read in pieces and cut, so neither time nor memory depends on line length.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Protocol

from gpuwarden.ops.triage.analyze import DEVICE_CARRY, SPECIALS, Analyzer, add_snapshot
from gpuwarden.ops.triage.findings import Report
from gpuwarden.ops.triage.lineparse import feed_block
from gpuwarden.ops.triage.logline import HUMAN_HINT_BYTES, MAX_LINE
from gpuwarden.ops.triage.patterns import PF_DETAIL  # noqa: F401  (their literals are listed below)
from gpuwarden.ops.triage.dispatch import Dispatch

CHUNK = 4 << 20
PIECE = 1 << 20  # the prefilter-or-not decision is taken per piece, so a storm in a quiet log is found
PROBE = 32 << 10
DENSE = 0.4
HEAD_LINES = 200  # fed whole, so the format and timestamps are known whatever the rules say
GROUP_CAP = 64 << 10  # a line and its indented continuations are kept together up to this size
# What a GPU driver line's message holds (analyze's GPU driver test is case-sensitive, so these are too).
GPU_WORDS = (b"amdgpu", b"nvidia", b"drm", b"NVRM")
_INDENT = (b" ", b"\t")
# Literals of what the analyzer looks at besides the rules' own hints.
EXTRA_TRIGGERS = SPECIALS + (
    "traceback (most recent call last)", "*error*", ":err", ": err:", ":crit", ": crit:", ":alert", ": alert:",
    ":emerg", ": emerg:",
)


def trigger_literals(analyzer: Analyzer) -> list[str]:
    """Every literal a line needs to be worth the analyzer's time (rules without one force a full read)."""
    out = set(EXTRA_TRIGGERS)
    for rule in analyzer.rules:
        if rule.hint is None:
            return []
        out.update((rule.hint,) if isinstance(rule.hint, str) else rule.hint)
    return sorted(out, key=len, reverse=True)


class _Found(Protocol):
    def start(self) -> int: ...

    def end(self) -> int: ...


class _LineFinder(Protocol):
    """The prefilter: a compiled bytes pattern, Python's re.Pattern or re2's (google-re2 ships no types)."""

    def finditer(self, text: bytes, pos: int = 0, endpos: int = ..., /) -> Iterator[_Found]: ...


def _compile(literals: list[str]) -> _LineFinder:
    body = b"|".join(re.escape(lit).encode() for lit in literals)
    pattern = rb"(?m)^[^\n]*?(?:" + body + rb")[^\n]*$"
    try:
        # optional (google-re2): linear-time matching in C; the prefilter is where a hostile log would bite
        # deferred: keeps `gpuwarden --help` cheap (2.5 ms there)
        import re2
        opts = re2.Options()
        opts.case_sensitive = False
        opts.log_errors = False
        finder: _LineFinder = re2.compile(pattern, opts)
        return finder
    except ImportError:
        return re.compile(pattern, re.IGNORECASE)


def line_filter(analyzer: Analyzer) -> Callable[[str], bool] | None:
    """A test of one line: does it hold any literal the analyzer looks for? (None: every line matters.)"""
    lits = trigger_literals(analyzer)
    if not lits:
        return None
    d = Dispatch((), lits)
    return lambda text: bool(d(text, text.lower())[1])


class _Prefilter:
    def __init__(self, analyzer: Analyzer):
        lits = trigger_literals(analyzer)
        self.regex = _compile(lits) if lits else None


def _lines_of(block: bytes) -> Iterable[tuple[int, int]]:
    """(start, end) of every line in block (end excludes the newline)."""
    start = 0
    n = len(block)
    while start < n:
        end = block.find(b"\n", start)
        if end < 0:
            end = n
        yield start, end
        start = end + 1


def analyze_stream(f: BinaryIO, source: str = "", analyzer: Analyzer | None = None,
                   max_bytes: int | None = None) -> Report:
    """Analyze a binary stream to its end (or max_bytes). Lines are decoded as UTF-8 with replacement."""
    a = analyzer or Analyzer(source)
    reader = StreamFeeder(a)
    remaining = max_bytes
    while True:
        size = CHUNK if remaining is None else min(CHUNK, remaining)
        if size <= 0:
            break
        chunk = f.read(size)
        if not chunk:
            break
        if remaining is not None:
            remaining -= len(chunk)
        reader.push(chunk)
    reader.close()
    report = a.finish(lines=reader.lines)
    if reader.cut:
        report.notes.append(f"{reader.cut} line(s) longer than {MAX_LINE} characters were cut")
    return report


class StreamFeeder:
    """Splits pushed bytes into lines, prefilters them in bulk and feeds the analyzer the ones that matter."""

    def __init__(self, analyzer: Analyzer):
        self.a = analyzer
        self.prefilter = _Prefilter(analyzer).regex
        self.tail = b""  # the last line and its continuations so far, then an unfinished line (bounded)
        self.skipping = False  # inside an over-long line whose head was already taken
        self.lines = 0  # complete lines seen
        self.cut = 0
        self.relative = False  # the piece being read has what may be `dmesg -H` stamps

    def push(self, data: bytes) -> None:
        if self.skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return
            data, self.skipping = data[nl + 1:], False
            self.lines += 1
        buf = self.tail + data if self.tail else data
        end = buf.rfind(b"\n") + 1  # past the last complete line (0: none)
        if len(buf) - end > MAX_LINE:
            # an over-long line with no newline yet: the lines before it, then its head as a line of its own
            if end:
                self._block(buf[:end])
            self._block(buf[end:end + MAX_LINE] + b"\n")
            self.lines -= 1  # counted when its newline finally arrives
            self.cut += 1
            self.tail, self.skipping = b"", True
            return
        # The last line may have indented continuations in the next push: it waits for them (the prefilter
        # needs a header and its continuations in one piece), unless the unfinished line already starts a new one.
        cut = end if buf[end:end + 1] not in (b"",) + _INDENT else self._group_start(buf, end)
        self.tail = buf[cut:]  # the waiting lines and the unfinished one
        if cut:
            self._block(buf[:cut])

    @staticmethod
    def _group_start(buf: bytes, end: int) -> int:
        """Where the last line before `end` that is not an indented continuation starts (end if too far back)."""
        start = end
        while start > 0:
            start = buf.rfind(b"\n", 0, start - 1) + 1
            if end - start > GROUP_CAP:
                return end
            if buf[start:start + 1] not in _INDENT:
                break
        return start

    def close(self) -> None:
        if self.skipping:  # an over-long last line with no newline: its head was fed already
            self.lines += 1
            self.skipping = False
        if self.tail:
            self._block(self.tail if self.tail.endswith(b"\n") else self.tail + b"\n")
            self.tail = b""

    def _feed(self, block: bytes, start: int, end: int, number: int) -> None:
        if end - start > MAX_LINE:
            end = start + MAX_LINE
            self.cut += 1
        self.a.feed(block[start:end].decode("utf-8", "replace"), number)

    def _block(self, block: bytes) -> None:
        """A run of complete lines (ending with a newline), fed in pieces of about PIECE bytes."""
        start = 0
        while start < len(block):
            end = block.find(b"\n", min(start + PIECE, len(block) - 1)) + 1 or len(block)
            while block[end:end + 1] in _INDENT and end - start < PIECE + GROUP_CAP:
                end = block.find(b"\n", end) + 1 or len(block)  # a header's continuations stay in its piece
            self._piece(block[start:end] if start or end < len(block) else block)
            start = end

    def _piece(self, block: bytes) -> None:
        base = self.lines  # lines before this piece
        count = block.count(b"\n")
        if self.prefilter is None or base + count <= HEAD_LINES or self._dense(self.prefilter, block):
            # every line: a storm where most lines matter anyway costs less without the prefilter. The block is
            # split, decoded and parsed in one call where the compiled parser is there (lineparse decides)
            self.cut += feed_block(block, base + 1, self.a)
            self.lines += count
            return
        pos = 0  # first byte not yet fed or skipped
        number = base  # number of the line before pos
        self.relative = HUMAN_HINT_BYTES.search(block) is not None
        if base < HEAD_LINES:
            for s, e in _lines_of(block):
                number += 1
                self._feed(block, s, e, number)
                pos = e + 1
                if number >= HEAD_LINES:
                    break
        pos, number = self._wanted(block, pos, number)  # a window opened in the piece before goes on here
        for m in self.prefilter.finditer(block, pos):
            s, e = m.start(), m.end()
            if s < pos:
                continue
            head = s
            if block[s:s + 1] in _INDENT:  # a continuation: its header (and the lines between) come first
                while head > pos:
                    head = block.rfind(b"\n", pos, head - 1) + 1 or pos
                    if block[head:head + 1] not in _INDENT:
                        break
            if head > pos:
                self._context(block, pos, head, number)
            number += block.count(b"\n", pos, head)
            while head < s:
                nl = block.find(b"\n", head)
                number += 1
                self._feed(block, head, nl, number)
                head = nl + 1
            number += 1
            self._feed(block, s, e, number)
            pos, number = self._wanted(block, e + 1, number)
        if pos < len(block):
            self._context(block, pos, len(block), number)
        self.lines += count

    def _context(self, block: bytes, start: int, end: int, number: int) -> None:
        """Lines [start, end) are skipped (number: the line before start). Hand the analyzer what reading them
        would have told it about the lines after: the time `dmesg -H` stamps (offsets from the line before) add
        up to, and the GPU that the last driver line among them names (only the last DEVICE_CARRY lines count)."""
        if self.relative:
            at, line_no = start, number  # the start of the line after the last one parsed, and its number - 1
            for m in HUMAN_HINT_BYTES.finditer(block, start, end):
                if m.start() < at:
                    continue  # a second hint on a line already parsed
                line_start = block.rfind(b"\n", at, m.start()) + 1 or at
                line_end = block.find(b"\n", m.start())
                line_no += block.count(b"\n", at, line_start) + 1
                self.a.parser.parse(line_no, block[line_start:min(line_end, line_start + MAX_LINE)].decode(
                    "utf-8", "replace"))
                at = line_end + 1
        hi = end
        while True:
            at = max(block.rfind(word, start, hi) for word in GPU_WORDS)
            if at < 0:
                return
            line_start = block.rfind(b"\n", start, at) + 1 or start
            line_end = block.find(b"\n", at)
            if block.count(b"\n", line_end, end) > DEVICE_CARRY:
                return  # too far back to name the GPU of anything after `end`
            line_no = number + block.count(b"\n", start, line_start) + 1
            if self.a.note_gpu_line(block[line_start:min(line_end, line_start + MAX_LINE)].decode("utf-8", "replace"),
                                    line_no):
                return
            hi = line_start

    def _wanted(self, block: bytes, pos: int, number: int) -> tuple[int, int]:
        """Feed the lines from pos that an open window or a continuation wants, whatever they say."""
        while pos < len(block) and (self.a.following or block[pos:pos + 1] in (b" ", b"\t")):
            nl = block.find(b"\n", pos)
            number += 1
            self._feed(block, pos, nl, number)
            pos = nl + 1
        return pos, number

    def _dense(self, prefilter: _LineFinder, block: bytes) -> bool:
        """Whether more than DENSE of the first PROBE bytes' lines are candidates."""
        probe_end = block.find(b"\n", min(PROBE, len(block) - 1)) + 1 or len(block)
        lines = block.count(b"\n", 0, probe_end)
        if lines < 64:
            return False
        hits = sum(1 for _ in prefilter.finditer(block, 0, probe_end))
        return hits > DENSE * lines


def analyze_file(path: Path, snapshot: dict[str, Any] | None = None) -> Report:
    """Stream a log file (bounded memory, long lines cut), with the snapshot's findings when one is given."""
    with open(path, "rb") as f:
        report = analyze_stream(f, source=str(path))
    if snapshot:
        add_snapshot(report, snapshot, str(path))
    return report
