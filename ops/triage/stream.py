"""Feed a log of any size to the analyzer in bounded memory, skipping lines that cannot matter.

The file is read in chunks. One prefilter (every literal some rule requires, case-insensitive) runs over
each chunk in C (RE2 when the google-re2 wheel is there: linear time whatever the input; Python's re
otherwise) and finds the candidate lines; only those, and the lines an open detail window or a possible
continuation wants, reach Python code. A line longer than logline.MAX_LINE is cut, and a line with no
newline at all is read in pieces and cut, so neither time nor memory depends on line length.
"""

from __future__ import annotations

import re
from typing import BinaryIO, Iterable

from .analyze import SPECIALS, Analyzer
from .findings import Report
from .logline import MAX_LINE
from .patterns import PF_DETAIL  # noqa: F401  (their literals are listed below)

CHUNK = 4 << 20
PIECE = 1 << 20  # the prefilter-or-not decision is taken per piece, so a storm in a quiet log is found
PROBE = 32 << 10
DENSE = 0.4
HEAD_LINES = 200  # fed whole, so the format and timestamps are known whatever the rules say
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


def _compile(literals: list[str]):
    body = b"|".join(re.escape(lit).encode() for lit in literals)
    pattern = rb"(?m)^[^\n]*?(?:" + body + rb")[^\n]*$"
    try:
        import re2  # linear-time matching in C; the prefilter is where a hostile log would bite
        opts = re2.Options()
        opts.case_sensitive = False
        opts.log_errors = False
        return re2.compile(pattern, opts)
    except ImportError:
        return re.compile(pattern, re.IGNORECASE)


def line_filter(analyzer: Analyzer):
    """A test of one line: does it hold any literal the analyzer looks for? (None: every line matters.)"""
    from .dispatch import Dispatch
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
        self.tail = b""  # an unfinished line (at most MAX_LINE bytes kept)
        self.skipping = False  # inside an over-long line whose head was already taken
        self.lines = 0  # complete lines seen
        self.cut = 0

    def push(self, data: bytes) -> None:
        if self.skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return
            data, self.skipping = data[nl + 1:], False
            self.lines += 1
        buf = self.tail + data if self.tail else data
        end = buf.rfind(b"\n")
        if end < 0:
            self._hold(buf)
            return
        self.tail = b""
        self._block(buf[:end + 1])
        self._hold(buf[end + 1:])

    def _hold(self, rest: bytes) -> None:
        if len(rest) > MAX_LINE:
            # an over-long line with no newline yet: keep its head as a line of its own, drop the rest
            self._block(rest[:MAX_LINE] + b"\n")
            self.lines -= 1  # counted when its newline finally arrives
            self.cut += 1
            self.tail, self.skipping = b"", True
        else:
            self.tail = rest

    def close(self) -> None:
        if self.skipping:  # an over-long last line with no newline: its head was fed already
            self.lines += 1
            self.skipping = False
        if self.tail:
            self._block(self.tail + b"\n")
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
            self._piece(block[start:end] if start or end < len(block) else block)
            start = end

    def _piece(self, block: bytes) -> None:
        base = self.lines  # lines before this piece
        count = block.count(b"\n")
        if self.prefilter is None or base + count <= HEAD_LINES or self._dense(block, count):
            # every line: a storm where most lines matter anyway costs less without the prefilter
            feed = self.a.feed
            lines = block.split(b"\n")
            lines.pop()  # the block ends with a newline: nothing after it
            for number, line in enumerate(lines, base + 1):
                if len(line) > MAX_LINE:
                    line = line[:MAX_LINE]
                    self.cut += 1
                feed(line.decode("utf-8", "replace"), number)
            self.lines += count
            return
        pos = 0  # first byte not yet fed or skipped
        number = base  # number of the line before pos
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
            number += block.count(b"\n", pos, s) + 1
            self._feed(block, s, e, number)
            pos, number = self._wanted(block, e + 1, number)
        self.lines += count

    def _wanted(self, block: bytes, pos: int, number: int) -> tuple[int, int]:
        """Feed the lines from pos that an open window or a continuation wants, whatever they say."""
        while pos < len(block) and (self.a.following or block[pos:pos + 1] in (b" ", b"\t")):
            nl = block.find(b"\n", pos)
            number += 1
            self._feed(block, pos, nl, number)
            pos = nl + 1
        return pos, number

    def _dense(self, block: bytes, count: int) -> bool:
        """Whether more than DENSE of the first PROBE bytes' lines are candidates."""
        probe_end = block.find(b"\n", min(PROBE, len(block) - 1)) + 1 or len(block)
        lines = block.count(b"\n", 0, probe_end)
        if lines < 64:
            return False
        hits = sum(1 for _ in self.prefilter.finditer(block, 0, probe_end))
        return hits > DENSE * lines
