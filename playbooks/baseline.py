"""The baseline playbook: record each GPU's idle VRAM use, so residual counts only what tenants left behind.

Refuses a GPU that any process uses, or whose unexplained use looks like a leak (reset it first).
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.node import nodestate
from gpuwarden.ops.sampling.attribution import TOLERANCE_FRACTION, TOLERANCE_NO_BASELINE
from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.playbooks import nodecheck
from gpuwarden.playbooks.framework import Playbook, RunContext, Step, StepFailed


class BaselinePlaybook(Playbook):
    name = "baseline"
    destructive = False

    def __init__(self, gpu: int | None = None, *, force: bool = False):
        self.gpu = gpu
        self.force = force
        self.description = f"record the idle VRAM baseline of {'GPU ' + str(gpu) if gpu is not None else 'every GPU'}"
        self._scope: list[int] = [] if gpu is None else [gpu]

    def gpus(self) -> tuple[int, ...]:
        return tuple(self._scope)

    def summary(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "force": self.force}

    def preconditions(self, ctx: RunContext) -> list[str]:
        snap = nodecheck.snapshot(ctx.settings)
        self._scope = nodecheck.scope(snap, self.gpu)
        return [p for g in self._scope for p in self._problems(snap, g)]

    def _problems(self, snap, g: int) -> list[str]:
        problems = [f"GPU {g} is in use by {nodecheck.describe(p, g)}" for p in nodecheck.users(snap, g)]
        res = next((r for r in snap.residual if r.gpu_index == g), None)
        if res is not None:
            problems += [f"GPU {g} has a leftover holder: pid {h.pid} ({h.reason})" for h in res.holders]
        info = snap.gpu(g)
        if not problems and not self.force and info is not None and info.vram_used is not None:
            # Idle use this high is a leak, not a baseline: recording it would hide it for good.
            limit = max(TOLERANCE_NO_BASELINE, int((info.vram_total or 0) * TOLERANCE_FRACTION))
            if info.vram_used > limit:
                problems.append(f"GPU {g} uses {fmt_bytes(info.vram_used)} with no process: that looks like a "
                                f"leak, not an idle baseline (reset it first, or pass --force)")
        return problems

    def plan(self, ctx: RunContext) -> list[Step]:
        return [Step("record", self.description + " (no process may hold it)", self._record, destructive=True)]

    def _record(self, ctx: RunContext) -> str:
        # Look again under the GPU locks: a tenant may have started since the plan.
        snap = nodecheck.snapshot(ctx.settings)
        problems = [p for g in self._scope for p in self._problems(snap, g)]
        if problems:
            raise StepFailed("not recorded: " + "; ".join(problems), "stop those processes first")
        values = {g: snap.gpu(g).vram_used for g in self._scope if snap.gpu(g) and snap.gpu(g).vram_used is not None}
        if not values:
            raise StepFailed("the backend reports no VRAM use for these GPUs: nothing to record")
        nodestate.set_baseline(ctx.settings.state_dir, values, snap.backend)
        ctx.scratch["baseline"] = values
        return "recorded " + ", ".join(f"GPU {g}: {fmt_bytes(v)}" for g, v in sorted(values.items()))
