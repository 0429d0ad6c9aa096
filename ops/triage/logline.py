"""Split a kernel-log line into its timestamp and message, whatever tool wrote it.

Knows dmesg ([mono]), dmesg -T/--ctime, dmesg --time-format iso (with or without -x), syslog/journalctl.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass

# `dmesg -x`: "kern  :err   : " before the timestamp; the level feeds the catch-all.
_FACILITY = re.compile(
    r"^(?P<fac>kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])\s*:"
    r"\s*(?P<lvl>emerg|alert|crit|err|warn|notice|info|debug)\s*:\s?")
_ISO = re.compile(
    r"^(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s?")
_CTIME = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) "
    r"(?P<hms>\d\d:\d\d:\d\d) (?P<year>\d{4})\]\s?")
# Month is any word: journalctl prints it in the reader's locale ("kvě" in one fixture).
# The host is optional: some pastes drop it ("May 18 19:02:39 kernel: NVRM: ...").
_SYSLOG = re.compile(
    r"^(?P<mon>[^\W\d_]{3,5}\.?)\s+(?P<day>\d{1,2})\s+(?P<hms>\d\d:\d\d:\d\d)\s+"
    r"(?:(?P<prog0>[\w./@-]+?)(?:\[\d+\])?:\s|(?P<host>\S+)\s+(?P<prog>[\w./@-]+?)(?:\[\d+\])?:\s?)")
_MONO = re.compile(r"^\[\s*(?P<mono>\d+\.\d+)\]\s?")
# Syslog from rsyslog's ISO template: "2024-01-02T03:04:05.123456+00:00 host kernel: ..."
_ISO_SYSLOG_TAIL = re.compile(r"^(?P<host>\S+)\s+(?P<prog>[\w./@-]+?)(?:\[\d+\])?:\s?")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}


@dataclass(frozen=True)
class LogLine:
    number: int  # 1-based line number in the source
    raw: str
    message: str  # text after every prefix this module knows
    stamp: str | None = None  # the timestamp as printed (for the report)
    mono: float | None = None  # seconds since boot, where the line has them
    wall: float | None = None  # seconds since the epoch, where the line has a date we can place
    level: str | None = None  # from dmesg -x
    program: str | None = None  # syslog program ("kernel", "sudo", ...)
    continuation: bool = False  # no prefix and indented: part of the line before


def _iso_epoch(text: str) -> float | None:
    text = text.replace(",", ".")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return when.timestamp()  # local time, as dmesg printed it
    return when.timestamp()


def _local_epoch(year: int, month: int, day: int, hms: str) -> float | None:
    try:
        h, m, s = (int(x) for x in hms.split(":"))
        return dt.datetime(year, month, day, h, m, s).timestamp()
    except ValueError:
        return None


def parse(number: int, raw: str) -> LogLine:
    """Strip known prefixes from one line; never fails (unknown prefixes stay in the message)."""
    rest = raw.rstrip("\r\n")
    level = stamp = program = None
    mono = wall = None
    prefixed = False

    m = _FACILITY.match(rest)
    if m:
        level, rest, prefixed = m["lvl"], rest[m.end():], True
    m = _ISO.match(rest)
    if m:
        stamp, wall, rest, prefixed = m["iso"], _iso_epoch(m["iso"]), rest[m.end():], True
        t = _ISO_SYSLOG_TAIL.match(rest)
        if t and t["prog"] in ("kernel",):
            program, rest = t["prog"], rest[t.end():]
    else:
        m = _CTIME.match(rest)
        if m:
            stamp, prefixed = m.group(0).strip()[1:-1], True
            wall = _local_epoch(int(m["year"]), _MONTHS.get(m["mon"], 1), int(m["day"]), m["hms"])
            rest = rest[m.end():]
        else:
            m = _SYSLOG.match(rest)
            if m:
                stamp = f"{m['mon']} {m['day']} {m['hms']}"
                program, rest, prefixed = m["prog"] or m["prog0"], rest[m.end():], True
    m = _MONO.match(rest)
    if m:
        mono = float(m["mono"])
        if stamp is None:
            stamp = m["mono"]
        rest, prefixed = rest[m.end():], True
    continuation = not prefixed and raw[:1] in (" ", "\t")
    return LogLine(number, raw.rstrip("\r\n"), rest, stamp, mono, wall, level, program, continuation)


def parse_lines(text: str) -> list[LogLine]:
    return [parse(i, line) for i, line in enumerate(text.splitlines(), 1)]


def join_continuations(lines: list[LogLine]) -> list[LogLine]:
    """Glue unprefixed indented lines onto the stamped line before them.

    The NVIDIA driver prints one message over several lines ("NVRM: The NVIDIA GPU ... has /
    NVRM: fallen off the bus"); only the first carries a timestamp. Logs with no stamps at all
    (a pasted excerpt) are left alone, since every indented line there is its own record.
    """
    out: list[LogLine] = []
    for line in lines:
        prev = out[-1] if out else None
        if line.continuation and prev is not None and prev.stamp is not None:
            joined = prev.message.rstrip() + " " + line.message.strip()
            out[-1] = LogLine(prev.number, prev.raw + "\n" + line.raw, joined, prev.stamp, prev.mono,
                              prev.wall, prev.level, prev.program, prev.continuation)
            continue
        out.append(line)
    return out
