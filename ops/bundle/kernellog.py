"""The kernel log, from the best source this node allows: dmesg, else journalctl -k, else /dev/kmsg.

Every attempt is recorded (a failed dmesg says why); --since keeps only lines inside the window.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.triage.logline import parse
from gpuwarden.ops.bundle.entries import DENIED, FAILED, MISSING, OK, TIMED_OUT, Entry
from gpuwarden.ops.bundle.runner import CommandResult, run_command

PATH = "kernel/kernel.log"
KMSG_MAX_RECORDS = 200_000


def _filter_since(text: str, since_s: float | None, uptime: float | None) -> str:
    """Drop lines stamped before now - since; unstamped lines stay with the line before them."""
    if not since_s:
        return text
    cutoff_wall = time.time() - since_s
    cutoff_mono = (uptime - since_s) if uptime is not None else None
    out, keep = [], False
    for n, raw in enumerate(text.splitlines(True), 1):
        line = parse(n, raw)
        if line.wall is not None:
            keep = line.wall >= cutoff_wall
        elif line.mono is not None and cutoff_mono is not None:
            keep = line.mono >= cutoff_mono
        if keep:
            out.append(raw)
    return "".join(out)


def _uptime(proc_root: Path) -> float | None:
    try:
        return float((proc_root / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_kmsg(dev_root: Path, since_s: float | None, uptime: float | None) -> tuple[str | None, str | None]:
    """Drain /dev/kmsg without blocking: (text as '[secs] msg' lines, error)."""
    try:
        fd = os.open(dev_root / "kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"{dev_root / 'kmsg'}: {exc.strerror}"
    lines: list[str] = []
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                rec = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:
                    continue  # overwritten while reading: the next read resyncs
                return None, f"/dev/kmsg: {exc.strerror}"
            if not rec:
                break
            head, _, body = rec.decode(errors="replace").partition(";")
            fields = head.split(",")
            try:
                usec = int(fields[2])
            except (IndexError, ValueError):
                continue
            secs = usec / 1e6
            if since_s and uptime is not None and secs < uptime - since_s:
                continue
            # Continuation lines (" KEY=value") are dictionary metadata, not message text.
            message = body.split("\n", 1)[0]
            lines.append(f"[{secs:12.6f}] {message}\n")
    finally:
        os.close(fd)
    return "".join(lines), None


def collect(settings: Settings, since_s: float | None, deadline: float) -> list[Entry]:
    """Try each source in turn; each attempt gets the time left until the collector's deadline."""
    entries: list[Entry] = []
    uptime = _uptime(settings.proc_root)

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    res = run_command(["dmesg", "--time-format", "iso", "--nopager"], left())
    if res.exit_code == 0 and not res.timed_out and res.stdout.strip():
        text = _filter_since(res.stdout.decode(errors="replace"), since_s, uptime)
        return [Entry("kernel-log", " ".join(res.argv), "command", path=PATH, data=text.encode(),
                      exit_code=0, duration_s=res.duration_s)]
    entries.append(_attempt(res))
    if entries[-1].status == FAILED and res.exit_code not in (None, 0):
        # an old or busybox dmesg without --time-format: its plain output still has [seconds] stamps
        res = run_command(["dmesg"], left())
        if res.exit_code == 0 and not res.timed_out and res.stdout.strip():
            text = _filter_since(res.stdout.decode(errors="replace"), since_s, uptime)
            entries.append(Entry("kernel-log", "dmesg", "command", path=PATH, data=text.encode(), exit_code=0,
                                 duration_s=res.duration_s))
            return entries
        entries.append(_attempt(res))

    argv = ["journalctl", "-k", "-o", "short-iso", "--no-pager", "-q"]
    if since_s:
        argv.append(f"--since=@{int(time.time() - since_s)}")
    res = run_command(argv, left())
    if res.exit_code == 0 and not res.timed_out and res.stdout.strip():
        entries.append(Entry("kernel-log", " ".join(argv), "command", path=PATH, data=res.stdout,
                             exit_code=0, duration_s=res.duration_s))
        return entries
    entries.append(_attempt(res))

    t0 = time.monotonic()
    kmsg, error = read_kmsg(settings.dev_root, since_s, uptime)
    if kmsg is not None:
        entries.append(Entry("kernel-log", str(settings.dev_root / "kmsg"), "file", path=PATH, data=kmsg.encode(),
                             duration_s=time.monotonic() - t0))
    else:
        entries.append(Entry("kernel-log", str(settings.dev_root / "kmsg"), "file",
                             status=DENIED if "ermission" in (error or "") else FAILED, error=error,
                             duration_s=time.monotonic() - t0))
    return entries


def _attempt(res: CommandResult) -> Entry:
    cmd = " ".join(res.argv)
    if res.timed_out:
        return Entry("kernel-log", cmd, "command", status=TIMED_OUT, timed_out=True, error=res.error,
                     duration_s=res.duration_s)
    if res.error:
        return Entry("kernel-log", cmd, "command", status=MISSING, error=res.error, duration_s=res.duration_s)
    why = res.stderr.decode(errors="replace").strip().splitlines()
    status = DENIED if any("ermission" in w or "not permitted" in w for w in why) else FAILED
    if res.exit_code == 0:
        why = ["printed nothing"]
    return Entry("kernel-log", cmd, "command", status=status, exit_code=res.exit_code,
                 error=(why[-1][:200] if why else f"exit {res.exit_code}"), duration_s=res.duration_s)


__all__ = ["collect", "PATH", "OK"]
