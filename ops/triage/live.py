"""Triage as a kernel log is written: the node agent's kernel-log watch feeds each new line and gets back
the findings that line created or made grow (cheap per line, bounded state for a process that runs for months).

    live = LiveTriage()
    for record in kmsg_records:            # or: for line in follow("journalctl -kf")
        for finding in live.feed_kmsg(record):   # live.feed(text_line) for already formatted lines
            publish(finding.to_dict())     # rule, severity, title, devices, victims, count, ...
    live.report()                          # everything so far, ordered, with the headline
"""

from __future__ import annotations

from gpuwarden.ops.triage.analyze import Analyzer
from gpuwarden.ops.triage.findings import Finding, Report
from gpuwarden.ops.triage.stream import HEAD_LINES
from gpuwarden.ops.triage.stream import line_filter

_LEVELS = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")


class LiveTriage:
    """One analyzer kept across lines; feed() returns what changed, report() the whole picture."""

    def __init__(self, source: str = "kernel log (live)") -> None:
        self.analyzer = Analyzer(source)
        self.wanted = line_filter(self.analyzer)
        self.pending: str | None = None  # a skipped line, counted when the next one shows it is not a header

    def feed(self, raw_line: str | bytes) -> list[Finding]:
        """One log line as text (any format triage reads). Returns findings new or grown because of it.

        A line that may be continued by the next one (an unfinished multi-line driver message) is judged when
        that next line arrives, so its finding can come back from the following call.
        """
        if isinstance(raw_line, bytes):
            raw_line = raw_line.decode("utf-8", "replace")
        a = self.analyzer
        continuation = raw_line[:1] in (" ", "\t")
        if self.pending is not None:
            header, self.pending = self.pending, None
            if continuation:
                a.feed(header)  # the line this one continues: one message, as reading every line makes it
            else:
                a.skip(header)  # still names the GPU for the driver lines after it, if it is a driver line
        if (self.wanted is not None and not a.following and not continuation
                and a.lines >= HEAD_LINES and not self.wanted(raw_line)):
            self.pending = raw_line.rstrip("\r\n")  # most kernel lines: counted, not parsed
            return []
        a.feed(raw_line.rstrip("\r\n"))
        return a.changed()

    def feed_kmsg(self, record: bytes | str) -> list[Finding]:
        """One /dev/kmsg record ("PRI,SEQ,USEC,FLAGS;message" then " KEY=value" dictionary lines)."""
        if isinstance(record, bytes):
            record = record.decode("utf-8", "replace")
        head, sep, body = record.partition(";")
        fields = head.split(",")
        if not sep or len(fields) < 3:
            return self.feed(record)
        try:
            level = _LEVELS[int(fields[0]) & 7]
            secs = int(fields[2]) / 1e6
        except (ValueError, IndexError):
            return self.feed(record)
        message = body.split("\n", 1)[0]  # the rest is dictionary metadata, not message text
        return self.feed(f"kern  :{level:<6}: [{secs:12.6f}] {message}")

    def report(self) -> Report:
        """Everything seen so far (the analyzer goes on; call it as often as needed)."""
        a = self.analyzer
        report = Report(source=a.source, lines=a.lines + (self.pending is not None),
                        findings=list(a.findings.values()), notes=list(a.notes))
        return report
