"""The drain and undrain playbooks: take one GPU out of service (mark, stop its engines, wait idle), or back in.

Only engines on that GPU are stopped, through their shims; other GPUs keep serving.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.node import nodestate
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.engines.control import stop_gpu

from gpuwarden.playbooks import nodecheck
from gpuwarden.playbooks.framework import Playbook, RunContext, SkipStep, Step, StepFailed


class DrainPlaybook(Playbook):
    name = "drain"
    destructive = True

    def __init__(self, gpu: int, *, timeout_s: float = 60.0, grace_s: float | None = None, reason: str = ""):
        self.gpu = gpu
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.reason = reason
        self.description = f"drain GPU {gpu}: mark it drained, stop its engines, wait until it is idle"

    def gpus(self) -> tuple[int, ...]:
        return (self.gpu,)

    def summary(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "reason": self.reason}

    def preconditions(self, ctx: RunContext) -> list[str]:
        snap = nodecheck.snapshot(ctx.settings)
        nodecheck.require_gpu(snap, self.gpu)
        engines = [e for e in snap.engines if e.gpu == self.gpu and e.phase not in ("exited", "crashed")]
        ctx.scratch["engines_planned"] = [e.name for e in engines]
        return []

    def plan(self, ctx: RunContext) -> list[Step]:
        names = ctx.scratch.get("engines_planned", [])
        stop_what = f"stop engine(s) {', '.join(names)} through their shims" if names else \
            "stop any engine on it through its shim (none running now)"
        return [
            Step("mark", f"mark GPU {self.gpu} drained (launch refuses it, status shows it)", self._mark,
                 destructive=True),
            Step("stop-engines", f"{stop_what} (stop signal, grace, SIGKILL)", self._stop, destructive=True),
            Step("wait-idle", f"wait up to {self.timeout_s:g}s until no process holds GPU {self.gpu} "
                              "and its VRAM is back at the baseline (memory no process holds is not "
                              "waited for: only a reset frees it)", self._wait),
        ]

    def _mark(self, ctx: RunContext) -> str:
        already = self.gpu in nodestate.drained(ctx.settings.state_dir)
        nodestate.set_drained(ctx.settings.state_dir, self.gpu, True, who=journal.who(), reason=self.reason)
        return f"GPU {self.gpu} {'was already' if already else 'is now'} drained"

    def _stop(self, ctx: RunContext) -> str:
        results = stop_gpu(ctx.settings, self.gpu, timeout_s=self.grace_s)
        stopped = [{"engine": r.name, "result": r.result, "detail": r.detail} for r in results]
        ctx.scratch["stopped"] = stopped
        for r in results:
            ctx.info(f"engine {r.name}: {r.result}" + (f" ({r.detail})" if r.detail else ""),
                     engine=r.name, result=r.result)
        if not results:
            raise SkipStep(f"no supervised engine runs on GPU {self.gpu}")
        return f"{len(results)} engine(s) on GPU {self.gpu} stopped: " + ", ".join(
            f"{r.name} ({r.result})" for r in results)

    def _wait(self, ctx: RunContext) -> str:
        # Right after an engine stopped, its VRAM may take a moment to return: only then is a short
        # settle worth it before calling what is left ownerless.
        snap, states = nodecheck.wait_idle_or_ownerless(ctx.settings, [self.gpu], self.timeout_s,
                                                        settle_s=2.0 if ctx.scratch.get("stopped") else 0.0,
                                                        cancelled=ctx.cancelled)
        state = states[self.gpu]
        ctx.scratch["remaining"] = list(state.problems)
        stopped = ctx.scratch.get("stopped", [])
        # One structured account for scripts (--json): what drain stopped, what is still there.
        ctx.info(f"GPU {self.gpu}: {len(stopped)} engine(s) stopped, {len(state.problems)} thing(s) remain",
                 gpu=self.gpu, stopped=stopped, remaining=list(state.problems))
        if state.ok:
            return f"GPU {self.gpu} is idle: no holders, VRAM at baseline"
        ownerless = nodecheck.ownerless_only(snap, self.gpu)
        if ownerless is not None:
            # Drained and unused: drain's job is done. The leak is a reset's job, so `drain && reset` works.
            ctx.scratch["ownerless"] = ownerless
            return (f"GPU {self.gpu} is drained and unused, but {fmt_bytes(ownerless)} of VRAM is held by no "
                    f"process: only a reset frees it (`gpuwarden reset {self.gpu}`, or `gpuwarden fix {self.gpu}` "
                    "to reset and put it back in service)")
        res = next((r for r in snap.residual if r.gpu_index == self.gpu), None)
        holders = nodecheck.process_holders(res.holders) if res else []
        live = nodecheck.live_users(snap, self.gpu)
        if holders and not live:
            hint = f"remove them with `gpuwarden purge {self.gpu}` (or `gpuwarden fix {self.gpu}`)"
        else:
            hint = (f"stop {'them' if len(live) > 1 else 'it'} (gpuwarden supervises none of them), then run "
                    f"`gpuwarden drain {self.gpu}` again")
        raise StepFailed(f"GPU {self.gpu} is drained but not idle after {self.timeout_s:g}s: "
                         + "; ".join(state.problems), hint)


class UndrainPlaybook(Playbook):
    name = "undrain"
    destructive = False

    def __init__(self, gpu: int):
        self.gpu = gpu
        self.description = f"undrain GPU {gpu}: launch may use it again"

    def gpus(self) -> tuple[int, ...]:
        return (self.gpu,)

    def summary(self) -> dict[str, Any]:
        return {"gpu": self.gpu}

    def preconditions(self, ctx: RunContext) -> list[str]:
        nodecheck.require_gpu(nodecheck.snapshot(ctx.settings), self.gpu)
        return []

    def plan(self, ctx: RunContext) -> list[Step]:
        return [Step("unmark", f"clear GPU {self.gpu}'s drained mark", self._unmark, destructive=True)]

    def _unmark(self, ctx: RunContext) -> str:
        if self.gpu not in nodestate.drained(ctx.settings.state_dir):
            raise SkipStep(f"GPU {self.gpu} was not drained")
        nodestate.set_drained(ctx.settings.state_dir, self.gpu, False)
        return f"GPU {self.gpu} is back in service"
