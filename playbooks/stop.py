"""The stop playbook: stop supervised engines through gpuwarden.ops.engines.control (its checks and journal).

`gpuwarden engines stop` and the TUI's stop key run this object, so both get the runner's GPU locks,
journal lines and events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwarden.ops.engines import control
from gpuwarden.ops.engines import state as st
from gpuwarden.playbooks.signalplan import Classifier, SignalPlan, engine_entries
from gpuwarden.playbooks.framework import Playbook, RunContext, SkipStep, Step


@dataclass
class StopEnginePlaybook(Playbook):
    engine: str | None = None
    gpu: int | None = None
    timeout_s: float | None = None
    # Several at once (`engines stop --all`): (name, gpu) pairs; `engine`/`gpu` name a single one.
    engines: tuple[tuple[str, int | None], ...] = ()

    name = "stop"
    destructive = True

    def targets(self) -> tuple[tuple[str, int | None], ...]:
        return self.engines or ((self.engine or "", self.gpu),)

    @property
    def description(self) -> str:  # type: ignore[override]
        names = ", ".join(n for n, _ in self.targets())
        return f"stop engine {names} (stop signal, grace, then SIGKILL)"

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({g for _, g in self.targets() if g is not None}))

    def summary(self) -> dict[str, Any]:
        return {"engines": [n for n, _ in self.targets()]}

    def preconditions(self, ctx: RunContext) -> list[str]:
        self.signal_plan = SignalPlan(engine_entries(Classifier(ctx.settings.proc_root, ctx.settings.state_dir),
                                                     ctx.settings.state_dir, [n for n, _ in self.targets()],
                                                     allowed=True, grace_s=self.timeout_s))
        return [f"no engine named {n!r} in {ctx.settings.state_dir}" for n, _ in self.targets()
                if st.read_state(ctx.settings.state_dir, n) is None and st.read_spec(ctx.settings.state_dir, n) is None]

    def plan(self, ctx: RunContext) -> list[Step]:
        return [Step(f"stop:{n}", f"stop engine {n} (stop signal, grace, then SIGKILL)",
                     lambda c, n=n: self._stop(c, n), destructive=True, continue_on_failure=True)
                for n, _ in self.targets()]

    def _stop(self, ctx: RunContext, name: str) -> str:
        result = control.stop(ctx.settings, name, timeout_s=self.timeout_s)
        ctx.scratch.setdefault("results", []).append(result)
        if result.result == "not-running":
            raise SkipStep(f"{name} is not running")
        return f"{name}: {result.result}" + (f" — {result.detail}" if result.detail else "")
