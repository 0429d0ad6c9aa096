"""CLI: `gpuwarden triage BUNDLE|LOGFILE` — what the kernel log says went wrong, grouped by signature.

Exit 0 when nothing at error level or worse was found, 1 when something was, 2 on a usage error.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import typer

from ops.errors import GpuwardenError, NotFound


def _report_for(path: str):
    from ops.triage import analyze_text
    if path == "-":
        return analyze_text(sys.stdin.read(), source="stdin")
    p = Path(path)
    if not p.exists():
        raise NotFound(f"no such file: {p}", "give a bundle (.tar.gz) or a kernel log file, or - for stdin")
    if p.is_dir():
        raise GpuwardenError(f"{p} is a directory", "give a bundle (.tar.gz) or a kernel log file")
    if tarfile.is_tarfile(p):
        from ops.bundle.replay import open_bundle, read_member, top_dir
        with open_bundle(p) as tar:
            top = top_dir(tar)
            log = read_member(tar, top, "kernel/kernel.log")
            snap = read_member(tar, top, "gpuwarden/snapshot.json")
            manifest = read_member(tar, top, "manifest.json")
        snapshot = None
        if snap:
            try:
                snapshot = json.loads(snap)
            except ValueError:
                snapshot = None
        report = analyze_text(log.decode(errors="replace") if log else "", source=f"{p}:kernel/kernel.log",
                              snapshot=snapshot)
        if log is None:
            report.notes.insert(0, "this bundle has no kernel log (see its manifest.json): snapshot only")
        try:
            from ops.bundle.collect import collector_findings
            report.findings.extend(collector_findings(json.loads(manifest or b"{}").get("collectors", [])))
        except ValueError:
            report.notes.append("the bundle's manifest.json is unreadable")
        return report
    try:
        data = p.read_bytes()
    except PermissionError:
        raise GpuwardenError(f"no permission to read {p}", "run as a user who can read it (or sudo)") from None
    if b"\0" in data[:65536]:
        raise GpuwardenError(f"{p} is not a kernel log (it holds binary data)", _WHAT_TO_GIVE)
    text = data.decode("utf-8", errors="replace")
    report = analyze_text(text, source=str(p))
    if report.lines and not report.findings and not _has_log_stamps(text):
        # Nothing matched and no line is shaped like a log line: "no findings" would be a false all-clear.
        raise GpuwardenError(f"{p} does not look like a kernel log: no line has a log timestamp "
                             "and none matched a pattern", _WHAT_TO_GIVE)
    return report


def _has_log_stamps(text: str) -> bool:
    from ops.triage.logline import parse_lines
    return any(line.stamp for line in parse_lines(text))


_WHAT_TO_GIVE = "give `dmesg` / `journalctl -k` output, a syslog file, or a bundle from `gpuwarden bundle`"


def register(app: typer.Typer) -> None:
    @app.command("triage")
    def triage_cmd(
        path: str = typer.Argument(..., metavar="BUNDLE|LOGFILE",
                                   help="An incident bundle (.tar.gz), a kernel log (dmesg, journalctl -k, syslog), "
                                        "or - to read stdin."),
        json_out: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
    ) -> None:
        """Find GPU trouble in a kernel log: page faults, ring timeouts, GPU resets (begin/succeeded/failed),
        RAS/ECC, PCIe AER, KFD evictions and userptr failures, MES/KIQ failures, NVIDIA Xids, GPUs fallen off
        the bus, OOM kills, hung tasks and user-space segfaults grouped by signature (library + offset: four
        processes crashing at the same place are one finding with four victims). For a bundle, residual VRAM
        and its holders at collection time are included.

        Exit status: 0 nothing at error level, 1 errors or critical findings, 2 usage error.
        """
        from ops.triage.render import as_json, markdown
        report = _report_for(path)
        if json_out:
            sys.stdout.write(as_json(report) + "\n")
        else:
            sys.stdout.write(markdown(report))
        counts = report.counts()
        raise typer.Exit(1 if counts.get("critical") or counts.get("error") else 0)
