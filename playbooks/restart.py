"""The restart playbook: start a supervised engine again from the spec it was launched with (the console's r).

A running engine is stopped first through its shim; a drained GPU refuses, as launch does.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.node import nodestate
from gpuwarden.ops.engines import control
from gpuwarden.ops.engines import state as st

from gpuwarden.playbooks.framework import Playbook, RunContext, Step


class RestartEnginePlaybook(Playbook):
    name = "restart"
    destructive = True

    def __init__(self, engine: str, gpu: int | None = None):
        self.engine = engine
        self.gpu = gpu
        self.description = f"restart engine {engine} from its recorded spec (stopped first if it runs)"

    def gpus(self) -> tuple[int, ...]:
        return () if self.gpu is None else (self.gpu,)

    def summary(self) -> dict[str, Any]:
        return {"engine": self.engine}

    def preconditions(self, ctx: RunContext) -> list[str]:
        if st.read_spec(ctx.settings.state_dir, self.engine) is None:
            return [f"no recorded spec for engine {self.engine!r}: start it with `gpuwarden launch {self.engine}`"]
        if self.gpu is not None and self.gpu in nodestate.drained(ctx.settings.state_dir):
            return [f"GPU {self.gpu} is drained: undrain it first (`gpuwarden undrain {self.gpu}`)"]
        return []

    def plan(self, ctx: RunContext) -> list[Step]:
        return [Step("restart", self.description, self._restart, destructive=True)]

    def _restart(self, ctx: RunContext) -> str:
        shim = control.restart(ctx.settings, self.engine)
        record = control.wait_for_record(ctx.settings, self.engine, shim)
        return f"{self.engine}: restarted under shim {shim} ({record.get('phase', 'starting')})"
