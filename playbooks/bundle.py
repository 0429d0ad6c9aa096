"""The bundle playbook: collect an incident bundle as one step, the same object for CLI and TUI.

It touches nothing on the node; collection itself lives in gpuwarden.ops.bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.bundle.collect import collect_bundle

from gpuwarden.playbooks.framework import Playbook, RunContext, Step


class BundlePlaybook(Playbook):
    """One step, collect: the same object the TUI's bundle key runs. Touches nothing on the node."""

    name = "bundle"
    destructive = False

    def __init__(self, *, output: Path | None = None, since: str | None = None, safe_mode: bool = False,
                 timeout_s: float = 10.0, max_bytes: int = 16 << 20):
        self.output, self.since, self.safe_mode = output, since, safe_mode
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self.description = "collect an incident bundle (logs, vendor tools, snapshot, raw trees) with a triage"

    def summary(self) -> dict[str, Any]:
        return {"output": str(self.output) if self.output else None, "since": self.since,
                "safe_mode": self.safe_mode, "timeout_s": self.timeout_s}

    def plan(self, ctx: RunContext) -> list[Step]:
        skip = " (vendor tools skipped: --safe-mode)" if self.safe_mode else ""
        return [Step("collect", f"run every collector concurrently, {self.timeout_s:g}s each{skip}; pack, "
                                "redact, triage and write the archive", self._collect)]

    def _collect(self, ctx: RunContext) -> str:
        def progress(event: str, name: str, done: int, total: int) -> None:
            if event == "collected":
                ctx.info(f"collected {done}/{total}: {name}", collector=name, done=done, total=total)
        try:
            result = collect_bundle(ctx.settings, output=self.output, since=self.since, safe_mode=self.safe_mode,
                                    timeout_s=self.timeout_s, max_bytes=self.max_bytes, progress=progress)
        except GpuwardenError as exc:
            ctx.scratch["error"] = exc  # the CLI shows it as its one-line error
            raise
        ctx.scratch["result"] = result
        ctx.scratch["bundle"] = str(result.path)
        for line in result.report.summary()[:5]:
            ctx.info(f"triage: {line}")
        # Its time is the step's own: the console and the CLI print the step's seconds after it (issue 36: twice).
        return f"{result.path} ({fmt_bytes(result.bytes)})"
