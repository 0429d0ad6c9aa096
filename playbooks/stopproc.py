"""The stop-process playbook: end one GPU process the operator picked (the console's k), through the reaper.

The reaper's rules hold: PID + start time checked right before each signal, protected processes refused,
every signal journalled; TERM, a grace, then KILL — or KILL at once when the operator chose it.
"""

from __future__ import annotations

import signal
from typing import Any

from gpuwarden.ops.foundation.model import GpuProcess
from gpuwarden.ops.clean.reaper import Reaper, Target, target_ticks, untouchable
from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.playbooks.framework import Playbook, RunContext, Step, StepFailed


class StopProcessPlaybook(Playbook):
    name = "stop-process"
    destructive = True

    def __init__(self, process: GpuProcess, *, kill_now: bool = False, grace_s: float = 5.0):
        self.process = process
        self.kill_now = kill_now
        self.grace_s = grace_s
        how = "SIGKILL" if kill_now else f"SIGTERM, then SIGKILL after {grace_s:g}s"
        self.description = f"stop pid {process.pid} ({(process.command or '?')[:50]}) with {how}"
        self._ticks: int | None = None

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(self.process.vram))

    def summary(self) -> dict[str, Any]:
        return {"pid": self.process.pid, "command": self.process.command[:200], "kill_now": self.kill_now}

    def preconditions(self, ctx: RunContext) -> list[str]:
        p = self.process
        self._ticks = target_ticks(p.pid, p.start_time, ctx.settings.proc_root)
        if self._ticks is None:
            return [f"pid {p.pid} is gone, or its PID now names another process: nothing to stop"]
        refusal = untouchable(p.pid, ctx.settings.proc_root)
        return [f"pid {p.pid} is not stopped: {refusal}"] if refusal else []

    def plan(self, ctx: RunContext) -> list[Step]:
        p = self.process
        held = f", holding {fmt_bytes(sum(p.vram.values()))} on GPU {','.join(map(str, sorted(p.vram)))}" \
            if p.vram else ""
        return [Step(f"pid-{p.pid}", self.description + held, self._stop, destructive=True)]

    def _stop(self, ctx: RunContext) -> str:
        p = self.process
        assert self._ticks is not None
        reaper = Reaper(ctx.settings, grace_s=self.grace_s, progress=lambda m: ctx.info(m))
        out = reaper.terminate(Target(p.pid, self._ticks, "operator", p.command, tuple(sorted(p.vram)),
                                      sum(p.vram.values()) or None),
                               first=signal.SIGKILL if self.kill_now else signal.SIGTERM)
        if not out.ok:
            raise StepFailed(f"pid {p.pid}: {out.detail}", out.next_step)
        return f"pid {p.pid}: {out.detail}"
