"""What a collector hands back: entries that become archive files, or records of what was not collected.

Every entry lands in manifest.json: stored ones with bytes and sha256, failed ones with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwarden.ops.bundle.runner import CommandResult

# status values
OK, FAILED, TIMED_OUT, DENIED, MISSING, SKIPPED = "ok", "failed", "timed-out", "permission-denied", "missing", "skipped"


@dataclass
class Entry:
    collector: str
    source: str  # the command line run or the path read
    kind: str = "file"  # file | command | python | generated | dir | link
    path: str | None = None  # where it goes in the archive (None: nothing stored)
    data: bytes | None = None
    status: str = OK
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float | None = None
    error: str | None = None
    link: str | None = None  # symlink target (fd entries of /proc trees)
    environ: bool = False  # NUL-separated environment: keep the allow-listed variables only
    cmdline: bool = False  # NUL-separated command line: redact option by option
    redact: bool = True
    # filled while packing
    truncated: bool = False
    original_bytes: int | None = None
    sha256: str | None = None
    redactions: dict[str, int] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"collector": self.collector, "kind": self.kind, "source": self.source,
                               "status": self.status}
        if self.path is not None:
            out["path"] = self.path
        if self.kind == "link":
            out["link"] = self.link
        for key in ("exit_code", "duration_s", "error"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, 3) if isinstance(value, float) else value
        out["timed_out"] = self.timed_out
        if self.data is not None and self.kind not in ("dir", "link"):
            out["bytes"] = len(self.data)
            out["sha256"] = self.sha256
            out["truncated"] = self.truncated
            if self.truncated:
                out["original_bytes"] = self.original_bytes
        if self.redactions:
            out["redacted"] = [{"pattern": k, "count": v} for k, v in sorted(self.redactions.items())]
        return out


def from_command(collector: str, res: CommandResult, path: str, *, keep_stderr: bool = True) -> list[Entry]:
    """A command's stdout as one entry (and its stderr beside it when it said something)."""
    cmd = " ".join(res.argv)
    if res.error and not res.timed_out:
        status = MISSING if "not installed" in res.error else FAILED
        return [Entry(collector, cmd, "command", status=status, error=res.error, duration_s=res.duration_s)]
    status = TIMED_OUT if res.timed_out else (OK if res.exit_code == 0 else FAILED)
    error = res.error
    if status == FAILED and not error:
        last = res.stderr.decode(errors="replace").strip().splitlines()
        error = f"exit {res.exit_code}" + (f": {last[-1][:200]}" if last else "")
    out = [Entry(collector, cmd, "command", path=path, data=res.stdout, status=status, exit_code=res.exit_code,
                 timed_out=res.timed_out, duration_s=res.duration_s, error=error)]
    if keep_stderr and res.stderr.strip():
        out.append(Entry(collector, cmd + " (stderr)", "command", path=path + ".stderr", data=res.stderr,
                         status=status, exit_code=res.exit_code, timed_out=res.timed_out))
    return out
