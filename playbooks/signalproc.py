"""The signal playbook: send one signal the operator picked in the console's process view (TERM ... KILL, CONT).

Through the reaper's one place a signal is sent: PID + start time checked again right before it, protected
processes refused, the signal journalled. Signals that end or freeze the process are destructive (confirmed).
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.node import procs
from gpuwarden.ops.foundation.model import GpuProcess
from gpuwarden.ops.clean.reaper import Reaper, target_ticks, untouchable

from gpuwarden.playbooks.framework import Playbook, RunContext, Step, StepFailed


class SignalProcessPlaybook(Playbook):
    name = "signal-process"

    def __init__(self, process: GpuProcess, signal_name: str, *, ends: bool | None = None):
        if signal_name not in procs.SIGNALS:
            raise ValueError(f"not a console signal: {signal_name}")
        self.process = process
        self.signal_name = signal_name
        # ends: whether it ends or freezes this process (procs.ends_or_freezes with its handlers); None: by default
        self.destructive = procs.ends_or_freezes(signal_name) if ends is None else ends
        self.description = (f"send SIG{signal_name} to pid {process.pid} ({(process.command or '?')[:50]}): "
                            f"{procs.SIGNALS[signal_name]}")
        self._ticks: int | None = None

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(self.process.vram)) if self.destructive else ()

    def summary(self) -> dict[str, Any]:
        return {"pid": self.process.pid, "signal": self.signal_name, "command": self.process.command[:200]}

    def preconditions(self, ctx: RunContext) -> list[str]:
        p = self.process
        self._ticks = target_ticks(p.pid, p.start_time, ctx.settings.proc_root)
        if self._ticks is None:
            return [f"pid {p.pid} is gone, or its PID now names another process (its start time differs): "
                    f"no SIG{self.signal_name} sent"]
        refusal = untouchable(p.pid, ctx.settings.proc_root)
        return [f"pid {p.pid} is not signalled: {refusal}"] if refusal else []

    def plan(self, ctx: RunContext) -> list[Step]:
        return [Step(f"sig{self.signal_name.lower()}-{self.process.pid}", self.description, self._send,
                     destructive=self.destructive)]

    def _send(self, ctx: RunContext) -> str:
        p = self.process
        assert self._ticks is not None
        sent = Reaper(ctx.settings).send(p.pid, self._ticks, procs.signal_number(self.signal_name), role="operator",
                                         target=p.pid, why=f"SIG{self.signal_name} chosen in the console")
        if sent == "gone":
            raise StepFailed(f"pid {p.pid} exited, or its PID now names another process: no SIG{self.signal_name} "
                             "sent", None)
        if sent == "denied":
            raise StepFailed(f"no permission to signal pid {p.pid}", "run gpuwarden as root or as the process's user")
        return f"SIG{self.signal_name} sent to pid {p.pid}"
