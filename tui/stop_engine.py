"""A playbook that stops one supervised engine through ops.engines.control (its checks and journal).

The CLI's `engines stop` calls control.stop directly; the TUI wraps the same call so it gets the runner's
confirmation, GPU lock, journal lines and progress events like every other action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ops.engines import control
from ops.engines import state as st
from playbooks.framework import Playbook, RunContext, SkipStep, Step


@dataclass
class StopEnginePlaybook(Playbook):
    engine: str
    gpu: int | None = None
    timeout_s: float | None = None

    name = "stop"
    destructive = True

    @property
    def description(self) -> str:  # type: ignore[override]
        return f"stop engine {self.engine} (stop signal, grace, then SIGKILL)"

    def gpus(self) -> tuple[int, ...]:
        return () if self.gpu is None else (self.gpu,)

    def summary(self) -> dict[str, Any]:
        return {"engine": self.engine}

    def preconditions(self, ctx: RunContext) -> list[str]:
        if st.read_state(ctx.settings.state_dir, self.engine) is None and \
                st.read_spec(ctx.settings.state_dir, self.engine) is None:
            return [f"no engine named {self.engine!r} in {ctx.settings.state_dir}"]
        return []

    def plan(self, ctx: RunContext) -> list[Step]:
        return [Step("stop", self.description, self._stop, destructive=True)]

    def _stop(self, ctx: RunContext) -> str:
        result = control.stop(ctx.settings, self.engine, timeout_s=self.timeout_s)
        if result.result == "not-running":
            raise SkipStep(f"{self.engine} is not running")
        return f"{self.engine}: {result.result}" + (f" — {result.detail}" if result.detail else "")
