"""CLI: `gpuwarden triage BUNDLE|LOGFILE|-` — what went wrong, most important first; `--explain RULE` says why.

Exit 0 when nothing at error level or worse was found, 1 when something was, 2 on bad input.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import typer

from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.triage.analyze import Analyzer
from gpuwarden.ops.triage.stream import StreamFeeder
from gpuwarden.ops.knowledge import load, cite
from gpuwarden.ops.triage import explain
from gpuwarden.ops.triage.render import as_json, markdown
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.knowledge.render import entry_text

_WHAT_TO_GIVE = ("give `dmesg` / `journalctl -k` output, a syslog file, an engine log, or a bundle from "
                 "`gpuwarden bundle`")
SNIFF = 64 << 10  # bytes looked at for binary data
PROGRESS_FROM = 64 << 20  # files at least this big show progress on a terminal


def _refuse_special(what: str, mode: int) -> None:
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise GpuwardenError(f"{what} is {kind}, not a log file",
                         "give a regular file, or pipe it in and use - (e.g. `dmesg | gpuwarden triage -`)")


def _open_path(p: Path) -> int:
    """An fd of a regular file, opened without blocking (a FIFO would block open() forever)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotFound(f"no such file: {p}", "give a bundle (.tar.gz), a log file, or - for stdin") from None
    except IsADirectoryError:
        raise GpuwardenError(f"{p} is a directory", "give a bundle (.tar.gz) or a log file") from None
    except PermissionError:
        raise GpuwardenError(f"no permission to read {p}", "run as a user who can read it (or sudo)") from None
    except OSError as exc:
        raise GpuwardenError(f"cannot open {p}: {exc.strerror}", "check the path") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise GpuwardenError(f"{p} is a directory", "give a bundle (.tar.gz) or a log file")
    if not stat.S_ISREG(mode):
        os.close(fd)
        _refuse_special(str(p), mode)
    os.set_blocking(fd, True)
    return fd


def _stdin_fd() -> int:
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    try:
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError):
        raise GpuwardenError("there is no standard input to read", "pipe a log into `gpuwarden triage -`") from None
    # a pipe, a file redirected in, a socket or a terminal; /dev/zero and friends would never end
    if stat.S_ISCHR(mode) and not os.isatty(fd):
        _refuse_special("standard input", mode)
    if stat.S_ISBLK(mode) or stat.S_ISDIR(mode):
        _refuse_special("standard input", mode)
    return fd


def _progress(size: int | None):
    if size is None or size < PROGRESS_FROM or not sys.stderr.isatty():
        return None
    total = size / (1 << 20)

    def show(done: int) -> None:
        sys.stderr.write(f"\rtriage: {done / (1 << 20):.0f}/{total:.0f} MiB read")
        sys.stderr.flush()
    return show


def _analyze_fd(fd: int, name: str, size: int | None):
    """Stream the log behind fd; refuse binary data and text that is no log at all (exit 2).

    A file (`size` given) is read to the size it had when triage started: a log still being written would
    otherwise be followed for as long as its writer writes; the report says how much it grew meanwhile."""
    a = Analyzer(name)
    feeder = StreamFeeder(a)
    first = True
    got = 0
    show = _progress(size)
    left = size
    grew = 0
    with os.fdopen(fd, "rb", closefd=True) as f:
        while left is None or left > 0:
            chunk = f.read(4 << 20 if left is None else min(4 << 20, left))
            if not chunk:
                break
            if left is not None:
                left -= len(chunk)
            if first and b"\0" in chunk[:SNIFF]:
                raise GpuwardenError(f"{name} is not a kernel log (it holds binary data)", _WHAT_TO_GIVE)
            first = False
            got += len(chunk)
            feeder.push(chunk)
            if show:
                show(got)
        if size is not None:
            grew = os.fstat(f.fileno()).st_size - size
    if show:
        sys.stderr.write("\n")
    feeder.close()
    if got == 0 or feeder.lines == 0:
        raise GpuwardenError(f"{name} is empty: there is nothing to triage", _WHAT_TO_GIVE)
    report = a.finish(lines=feeder.lines)
    if feeder.cut:
        report.notes.append(f"{feeder.cut} line(s) longer than the line limit were cut")
    if grew > 0:
        report.notes.append(f"{name} grew by {fmt_bytes(grew)} while triage read it: this report covers its first "
                            f"{fmt_bytes(got)}, as it was when triage started (run triage again for the rest)")
    if not report.findings and not a.stamped:
        # nothing matched and no line is shaped like a log line: "no findings" would be a false all-clear
        raise GpuwardenError(f"{name} does not look like a kernel log: no line has a log timestamp and none "
                             "matched a pattern", _WHAT_TO_GIVE)
    return report


def _report_for(path: str):
    report = _read_report(path)
    if not report.known:  # a bundle's triage cited already, with the bundle's versions
        cite(report)  # a bare log says nothing of the node's versions: matches say "not known"
        # deferred: keeps `gpuwarden triage --help` cheap (3.2 ms there)
        from gpuwarden.ops.triage import kfdrank
        kfdrank.rank(report, None)  # a bare log has no node context: the report says which it would need
    return report


def _read_report(path: str):
    if path == "-":
        return _analyze_fd(os.dup(_stdin_fd()), "stdin", None)
    p = Path(path)
    fd = _open_path(p)
    size = os.fstat(fd).st_size
    head = os.pread(fd, 512, 0)  # leaves the offset where it is, for the read that follows
    if head[:2] == b"\x1f\x8b" or (len(head) >= 262 and head[257:262] == b"ustar"):
        os.close(fd)
        # deferred: keeps `gpuwarden triage --help` cheap (13.4 ms there)
        from gpuwarden.ops.bundle.replay import is_tar
        if is_tar(p):  # a truncated or corrupt gzip is one line naming it
            # deferred: keeps `gpuwarden triage --help` cheap (40.4 ms there)
            from gpuwarden.ops.bundle.triage_file import triage_bundle
            return triage_bundle(p)
        raise GpuwardenError(f"{p} is compressed or archived but is not a bundle", _WHAT_TO_GIVE)
    return _analyze_fd(fd, str(p), size)


def _explain(name: str) -> None:
    if name in ("list", "all"):
        sys.stdout.write(explain.listing())
        return
    entry = explain.lookup(name)
    if entry is None:
        known = load().get(name)
        if known is not None:
            sys.stdout.write(entry_text(known))
            return
        close = explain.suggestions(name)
        raise GpuwardenError(f"no triage rule is called {name!r}",
                             (f"did you mean {', '.join(close)}? " if close else "")
                             + "`gpuwarden triage --explain list` lists every rule")
    sys.stdout.write(explain.text(entry))
    cited = load().by_rule.get(entry.id, [])
    if entry.id.startswith("xid"):  # an Xid number: the nvidia.xid entries whose pattern names that number
        cited = [e for e in load().by_rule.get("nvidia.xid", [])
                 if e.pattern is None or e.pattern.search(f"NVIDIA Xid {entry.id[3:]}: ")]
    if cited:
        sys.stdout.write("\nKnown issues with this signature (`gpuwarden known ID`):\n")
        sys.stdout.write("".join(f"  {e.id:44} {e.title}\n" for e in cited))


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("triage")
def triage_cmd(
    path: str = typer.Argument(None, metavar="[BUNDLE|LOGFILE|-]",
                               help="An incident bundle (.tar.gz), a kernel log (dmesg, dmesg -T/-H, "
                                    "journalctl -k, syslog), an engine's log, or - to read a pipe."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as a gpuwarden.triage/1 document."),
    explain_rule: str = typer.Option(None, "--explain", metavar="RULE",
                                     help="Say what a finding's rule means, the first thing to check and the known "
                                          "issues with that signature (a rule id from the report, xidN for an "
                                          "NVIDIA Xid, a known-issue id, or `list`)."),
) -> None:
    """Find what went wrong on a GPU node, most important first: the headline names the cause and what it led to.

    Reads kernel logs (GPU page faults, ring timeouts, resets, RAS/ECC, EDAC/MCE, PCIe AER, KFD, MES/KIQ,
    SMU/PSP/firmware, NVIDIA Xids and GSP, hung tasks, OOM kills, segfaults grouped by library + offset) and
    engine logs (HIP/HSA/CUDA errors, NCCL/RCCL, Python tracebacks). For a bundle it also says what each
    crashed engine died of (signal, faulting library + offset, core backtrace) and shows residual VRAM.
    Files of any size are streamed; a FIFO or a device is refused (pipe into - instead).

    Exit status: 0 nothing at error level, 1 errors or critical findings, 2 bad input (missing, empty,
    binary, not a log).
    """
    if explain_rule is not None:
        _explain(explain_rule)
        return
    if path is None:
        raise GpuwardenError("give a bundle, a log file or - (stdin)", "or --explain RULE to read about a rule")
    report = _report_for(path)
    sys.stdout.write(as_json(report) + "\n" if json_out else markdown(report))
    raise typer.Exit(report.exit_code())
