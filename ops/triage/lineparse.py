"""Which code splits, decodes and parses a block of log lines: the compiled one or the pure-Python one.

The one place that decides. ops/triage/_lines (native/triage/lines.c, built by setup.py, prebuilt in the
manylinux wheels) when it imports; logline.LineParser otherwise, or when GPUWARDEN_TRIAGE_PURE=1 (the tests
run both). Both give the same LogLine objects, so the same findings, report and --json.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from gpuwarden.ops.triage.logline import MAX_LINE, LineParser, LogLine

if TYPE_CHECKING:
    from gpuwarden.ops.triage.analyze import Analyzer

PURE_ENV = "GPUWARDEN_TRIAGE_PURE"


def _compiled() -> Any:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("gpuwarden.ops.triage._lines")  # built from native/triage/lines.c
    except ImportError:  # a source install without a compiler, or an interpreter that cannot load abi3
        return None


_LINES = _compiled()
COMPILED = _LINES is not None  # what `gpuwarden doctor`-style reports and the bench print


def feed_block(block: bytes, first: int, analyzer: Analyzer) -> int:
    """Feed every line of `block` (it ends with a newline), numbered from `first`, to the analyzer in order; how
    many lines were cut at MAX_LINE bytes. Compiled: the block parsed in one call, then each line fed. Pure:
    each line decoded and fed as it comes (no list of parsed lines to hold: as fast as before the compiled path)."""
    if _LINES is not None:
        lines, cut = parse_block(block, first, analyzer.parser)
        feed_line = analyzer.feed_line
        for line in lines:
            feed_line(line)
        return cut
    feed = analyzer.feed
    raws = block.split(b"\n")
    raws.pop()  # the block ends with a newline: nothing after it
    cut = 0
    for number, raw in enumerate(raws, first):
        if len(raw) > MAX_LINE:
            raw = raw[:MAX_LINE]
            cut += 1
        feed(raw.decode("utf-8", "replace"), number)
    return cut


def parse_block(block: bytes, first: int, parser: LineParser) -> tuple[list[LogLine], int]:
    """Every line of `block` (it ends with a newline), numbered from `first`, cut at MAX_LINE bytes, decoded as
    UTF-8 with replacement and parsed by `parser` in order: (lines, how many were cut)."""
    if _LINES is not None:
        lines: list[LogLine]
        cut: int
        lines, cut = _LINES.parse_block(block, first, MAX_LINE, parser.parse, parser.ctime, LogLine)
        return lines, cut
    return parse_block_pure(block, first, parser)


def parse_block_pure(block: bytes, first: int, parser: LineParser) -> tuple[list[LogLine], int]:
    """parse_block() in Python: what the compiled path must equal."""
    raws = block.split(b"\n")
    raws.pop()  # what follows the last newline (nothing, in a whole block)
    parse = parser.parse
    out = []
    cut = 0
    for number, raw in enumerate(raws, first):
        if len(raw) > MAX_LINE:
            raw = raw[:MAX_LINE]
            cut += 1
        out.append(parse(number, raw.decode("utf-8", "replace")))
    return out, cut
