"""Split a kernel-log line into its timestamp and message, whatever tool wrote it.

Knows dmesg ([mono], -T/--ctime, -H relative, --time-format iso, -x levels), syslog and journalctl
(short, short-precise, short-iso, no host), a bare `kernel:` prefix, remote syslog (`IP: kern: warning: [ISO]:`)
and `grep -r` file prefixes. A LineParser is stateful only for `dmesg -H`, whose stamps are relative.
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
import re
from dataclasses import dataclass

# Longest line analysed; the kernel itself never prints more than about 1 KiB in one record, so anything
# longer is a paste accident or hostile input and its tail is dropped (bounded time and memory).
MAX_LINE = 4096

_FAC = r"(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])"
_LVL = r"(?:emerg|alert|crit|err|warn|warning|notice|info|debug)"
# `dmesg -x`: "kern  :err   : " before the timestamp; the level feeds the catch-all.
_FACILITY = re.compile(rf"^(?P<fac>{_FAC})\s*:\s*(?P<lvl>{_LVL})\s*:\s?")
# A remote syslog relay: "192.168.11.119: kern: warning: [2026-04-22T21:27:51.29Z]: NVRM: ..."
_REMOTE = re.compile(rf"^(?P<host>[\w.:-]+): (?P<fac>{_FAC}): (?P<lvl>{_LVL}): \[(?P<iso>[0-9T:.,+Z-]+)\]:\s?")
# `grep -r` in /var/log: "/var/log/syslog:Apr  9 12:59:18 host kernel: ..."
_GREP = re.compile(r"^/[\w./-]*(?:syslog|messages|kern\.log|dmesg|journal|\.log)(?:\.\d+)?:(?=\S)")
_ISO = re.compile(r"^(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s?")
_CTIME = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) "
    r"(?P<hms>\d\d:\d\d:\d\d) (?P<year>\d{4})\]\s?")
# `dmesg -H`: "[May19 19:57]" starts a minute, "[  +0.000127]" is the offset from the line before.
_HUMAN_ABS = re.compile(r"^\[(?P<mon>[A-Z][a-z]{2})(?P<day>\d{1,2}) (?P<hm>\d\d:\d\d)\]\s?")
_HUMAN_REL = re.compile(r"^\[\s*\+\s*(?P<rel>\d+\.\d+)\]\s?")
# Found in every line a `dmesg -H` stamp is parsed from (and some others): such a line moves a LineParser's
# clock even when nothing else in it matters. The bytes form, for a whole block, knows ASCII blanks only.
HUMAN_HINT = re.compile(r"\[(?:\s*\+|[A-Z][a-z]{2}\d)")
HUMAN_HINT_BYTES = re.compile(rb"\[(?:[^\S\n]*\+|[A-Z][a-z]{2}\d)")
# Month is any word: journalctl prints it in the reader's locale ("kvě" in one fixture). The host is
# optional (some pastes drop it, or it is empty: "Jan 02 21:35:19  kernel:"); short-precise adds µs.
_SYSLOG = re.compile(
    r"^(?P<mon>[^\W\d_]{3,5}\.?)\s+(?P<day>\d{1,2})\s+(?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)?\s+"
    r"(?:(?P<prog0>[\w./@-]+?)(?:\[\d+\])?:\s|(?P<host>\S+)\s+(?P<prog>[\w./@-]+?)(?:\[\d+\])?:\s?)")
# A time with no date: "14:16:27.894416 pop-os kernel: ..."
_TIME_ONLY = re.compile(r"^(?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)?\s+(?:(?P<host>\S+)\s+)?(?P<prog>kernel):\s?")
_BARE_KERNEL = re.compile(r"^kernel:\s?")
_MONO = re.compile(r"^\[\s*(?P<mono>\d+\.\d+)\]\s?")
# Syslog from rsyslog's ISO template: "2024-01-02T03:04:05.123456+00:00 host kernel: ..."
_ISO_SYSLOG_TAIL = re.compile(r"^(?P<host>\S+)\s+(?P<prog>[\w./@-]+?)(?:\[\d+\])?:\s?")
# After "[": a weekday (ctime) or a month (dmesg -H) or "+" (relative); digits and spaces are [mono].
_CTIME_FIRST = frozenset("MTWFSAJNDO+")
# First characters a facility name can start with (kern, user, mail, daemon, auth, syslog, lpr, ...).
_FAC_FIRST = frozenset("kumdaslncf")
_MONO_SECOND = frozenset(" 0123456789")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}


@dataclass(slots=True)  # built for every line a rule may care about: slots, not frozen (3x cheaper to make)
class LogLine:
    number: int  # 1-based line number in the source
    raw: str
    message: str  # text after every prefix this module knows
    stamp: str | None = None  # the timestamp as printed (for the report)
    mono: float | None = None  # seconds since boot, where the line has them
    wall: float | None = None  # seconds since the epoch, where the line has a date we can place
    level: str | None = None  # from dmesg -x or a remote syslog
    program: str | None = None  # syslog program ("kernel", "sudo", ...)
    continuation: bool = False  # no prefix and indented: part of the line before
    prefixed: bool = False  # some prefix (stamp, program, level) was recognised


def _iso_epoch(text: str) -> float | None:
    text = text.replace(",", ".")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    head, dot, frac = text.partition(".")
    if dot:  # fromisoformat takes at most 6 fractional digits
        digits = len(frac) - len(frac.lstrip("0123456789"))
        text = f"{head}.{frac[:min(digits, 6)]}{frac[digits:]}"
    try:
        return dt.datetime.fromisoformat(text).timestamp()  # naive = local time, as dmesg printed it
    except ValueError:
        return None


@functools.lru_cache(maxsize=256)  # a storm repeats the same second many times
def _local_epoch(year: int, month: int, day: int, hms: str) -> float | None:
    try:
        h, m, s = (int(x) for x in hms.split(":"))
        return dt.datetime(year, month, day, h, m, s).timestamp()
    except ValueError:
        return None


class LineParser:
    """Parses lines in order; remembers the last absolute time for `dmesg -H` relative stamps."""

    def __init__(self) -> None:
        self.human_wall: float | None = None
        self.ctime: dict[str, tuple[str, float | None]] = {}  # "[Tue Mar  5 10:00:00 2024] " -> stamp, time

    def parse(self, number: int, raw: str) -> LogLine:
        """Strip known prefixes from one line; never fails (unknown prefixes stay in the message)."""
        if raw[:1] == "[" and raw[1:2] in _MONO_SECOND:
            # dmesg's own "[  12.345678] message", most lines of most logs: what the general path below
            # makes of it, without its checks (it has no other prefix, no CR/LF to strip, is not too long)
            m = _MONO.match(raw)
            if m is not None and len(raw) <= MAX_LINE and raw[-1:] not in ("\r", "\n"):
                stamp = m["mono"]
                return LogLine(number, raw, raw[m.end():], stamp, float(stamp), None, None, None, False, True)
        rest = raw.rstrip("\r\n")
        if len(rest) > MAX_LINE:
            rest = rest[:MAX_LINE]
        line_raw = rest
        level = stamp = program = None
        mono = wall = None
        prefixed = False

        first = rest[:1]
        if first == "[":  # the common case, dmesg: no other prefix can come first
            if rest[1:2] in _CTIME_FIRST or rest[1:14].lstrip().startswith("+"):
                stamp, wall, program, rest, prefixed = self._stamp(rest, prefixed)
        else:
            if first == "/":
                m = _GREP.match(rest)
                if m:
                    rest = rest[m.end():]
            # Each regex below is tried only where the text has what its match must start with (or contain):
            # the same answers, without a failed regex call for every syslog line.
            if (not first.isdigit() or ": " in rest[:40]) and ": [" in rest:
                m = _REMOTE.match(rest)
                if m:
                    level, stamp = m["lvl"], m["iso"]
                    wall, rest, prefixed = _iso_epoch(stamp), rest[m.end():], True
            if rest[:1] in _FAC_FIRST and not rest.startswith("kernel:"):  # no facility is spelt "kernel"
                m = _FACILITY.match(rest)
                if m:
                    level, rest, prefixed = m["lvl"], rest[m.end():], True
            if stamp is None:
                stamp, wall, program, rest, prefixed = self._stamp(rest, prefixed)
        if rest[:1] == "[":
            m = _MONO.match(rest)
            if m:
                mono = float(m["mono"])
                if stamp is None:
                    stamp = m["mono"]
                rest, prefixed = rest[m.end():], True
        continuation = not prefixed and raw[:1] in (" ", "\t")
        return LogLine(number, line_raw, rest, stamp, mono, wall, level, program, continuation, prefixed)

    def _stamp(self, rest: str, prefixed: bool) -> tuple[str | None, float | None, str | None, str, bool]:
        """(stamp, wall, program, rest, prefixed) for the date/time prefix of `rest`, if any."""
        first = rest[:1]
        if first == "[":
            m = _CTIME.match(rest)
            if m:
                # a storm prints many lines in the same second: its stamp and time are worked out once
                known = self.ctime.get(head := m.group(0))
                if known is None:
                    if len(self.ctime) >= 1024:
                        self.ctime.clear()
                    wall = _local_epoch(int(m["year"]), _MONTHS.get(m["mon"], 1), int(m["day"]), m["hms"])
                    known = self.ctime[head] = (head.strip()[1:-1], wall)
                return known[0], known[1], None, rest[m.end():], True
            m = _HUMAN_REL.match(rest)
            if m:
                if self.human_wall is not None:
                    self.human_wall += float(m["rel"])
                return f"+{m['rel']}", self.human_wall, None, rest[m.end():], True
            m = _HUMAN_ABS.match(rest)
            if m:
                year = dt.date.today().year  # dmesg -H prints no year
                self.human_wall = _local_epoch(year, _MONTHS.get(m["mon"], 1), int(m["day"]), m["hm"] + ":00")
                return f"{m['mon']}{m['day']} {m['hm']}", self.human_wall, None, rest[m.end():], True
            return None, None, None, rest, prefixed
        if first == "k" and rest.startswith("kernel:"):  # a bare `kernel:` prefix: no stamp below starts so
            m = _BARE_KERNEL.match(rest)
            assert m is not None  # the pattern asks for nothing past the "kernel:" just seen
            return None, None, "kernel", rest[m.end():], True
        if rest[4:5] == "-":
            m = _ISO.match(rest)
            if m:
                stamp, rest = m["iso"], rest[m.end():]
                t = _ISO_SYSLOG_TAIL.match(rest)
                program = None
                if t and t["prog"] == "kernel":
                    program, rest = t["prog"], rest[t.end():]
                return stamp, _iso_epoch(stamp), program, rest, True
        if first.isalnum():  # every letter (and digit) passes; the regexes decide
            m = _SYSLOG.match(rest)
            if m:
                return (f"{m['mon']} {m['day']} {m['hms']}", None, m["prog"] or m["prog0"], rest[m.end():], True)
        if rest[2:3] == ":":
            m = _TIME_ONLY.match(rest)
            if m:
                return m["hms"], None, "kernel", rest[m.end():], True
        return None, None, None, rest, prefixed


def parse(number: int, raw: str) -> LogLine:
    """One line on its own (no `dmesg -H` context)."""
    return LineParser().parse(number, raw)