"""The fix playbook: take one GPU from "residual VRAM" to "clean, verified" in one command.

Purges what a process holds, then, only when memory no process holds is left and a reset is allowed,
drains the GPU (its XGMI hive too), resets it, verifies it and puts it back in service.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable

from gpuwarden.ops.clean import gpureset
from gpuwarden.ops.foundation import journal
from gpuwarden.ops.node import nodestate
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.engines import control
from gpuwarden.playbooks.signalplan import Classifier, SignalPlan, engine_entries

from gpuwarden.playbooks import nodecheck
from gpuwarden.playbooks.framework import Playbook, RunContext, SkipStep, Step, StepFailed
from gpuwarden.playbooks.purge import PurgePlaybook
from gpuwarden.playbooks.reset import reset_step
from gpuwarden.ops.node.topology import reset_reach, topology


class FixPlaybook(Playbook):
    name = "fix"

    def __init__(self, gpu: int, *, allow_reset: bool = True, stop_engines: bool = False, grace_s: float = 5.0,
                 timeout_s: float = 10.0, reset_timeout_s: float = 60.0,
                 runner: gpureset.Runner = gpureset.run_command, which: gpureset.Which = shutil.which,
                 amdsmi_loader: Callable[[], Any] = gpureset.load_amdsmi, end_parents: bool = False):
        self.gpu = gpu
        self.end_parents = end_parents
        self.allow_reset = allow_reset
        self.stop_engines = stop_engines
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.runner, self.which, self.amdsmi_loader = runner, which, amdsmi_loader
        self.description = f"fix GPU {gpu}: purge what holds its residual VRAM, reset it only if that is " \
                           "not enough, then verify it is clean"
        self.destructive = True  # until the plan shows there is nothing to change
        self._clean = False
        self._purge: PurgePlaybook | None = None
        self._hive: list[int] = [gpu]
        self._engines: list[tuple[str, int]] = []  # (name, gpu) of engines serving on the hive
        self._no_reset: tuple[str, str] | None = None  # why a reset may not be done, and what allows it
        self._reach: str | None = None  # "resetting GPU 2 also resets ...": what a reset would take down

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(set(self._hive)))

    def summary(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "allow_reset": self.allow_reset, "stop_engines": self.stop_engines,
                "gpus_locked": list(self.gpus()), **({"end_parents": True} if self.end_parents else {})}

    # --- planning ------------------------------------------------------------------------------
    def preconditions(self, ctx: RunContext) -> list[str]:
        snap = nodecheck.snapshot(ctx.settings)
        info = nodecheck.require_gpu(snap, self.gpu)
        why = nodecheck.unreadable(snap, self.gpu)
        if why:
            # fix decides between purge and reset from what it reads: it does not guess.
            self._hive, self._purge = [self.gpu], None
            return [f"{why}; see `gpuwarden status`, then `gpuwarden reset {self.gpu} --force` once you know "
                    "what runs there"]
        left, holders = nodecheck.residual_left(snap, self.gpu)
        self._clean = left is None and not holders
        ctx.scratch["diagnosis"] = self._diagnose(snap, left, holders)
        if self._clean:
            self._hive, self._purge = [self.gpu], None
            self.signal_plan = SignalPlan()
            return []
        self._purge = PurgePlaybook(self.gpu, grace_s=self.grace_s, timeout_s=self.timeout_s,
                                    end_parents=self.end_parents)
        self._purge.preconditions(ctx)
        self.signal_plan = self._purge.signal_plan
        # Everything a reset takes down: the XGMI hive and the other partitions of the physical device.
        self._hive = [self.gpu, *nodecheck.reset_peers(snap, self.gpu)]
        self._engines = [(e.name, e.gpu) for e in snap.engines
                         if e.gpu in self._hive and e.phase not in ("exited", "crashed") and not e.stale]
        self._no_reset = self._why_no_reset(ctx, snap, info)
        reach = reset_reach(topology(snap, ctx.settings.sysfs_root), self.gpu)
        self._reach = reach
        self.confirm_note = f"if a reset is needed, {reach}" if reach and self._no_reset is None else ""
        if self._no_reset is None and self.stop_engines and self.signal_plan is not None:
            # --stop-engines is the operator's word for ending these supervised engines (only if a reset is needed).
            who = Classifier(ctx.settings.proc_root, ctx.settings.state_dir)
            for e in engine_entries(who, ctx.settings.state_dir, [n for n, _ in self._engines], allowed=True,
                                    grace_s=self.grace_s):
                e.condition = "only if a reset is needed; " + e.condition
                self.signal_plan.add(e)
        return []

    def _diagnose(self, snap: NodeSnapshot, left: int | None, holders: tuple) -> list[str]:
        if left is None and not holders:
            return [f"GPU {self.gpu} is clean: no residual VRAM and no holders"]
        lines = []
        if left is not None:
            lines.append(f"GPU {self.gpu} has {fmt_bytes(left)} of residual VRAM")
        movable = nodecheck.process_holders(holders)
        for h in movable:
            lines.append(f"held by pid {h.pid} ({h.reason}): purge removes it")
        peers = nodecheck.hive_peers(snap, self.gpu)
        if peers:
            lines.append(f"GPU {self.gpu} shares an XGMI hive with GPU {', '.join(map(str, peers))}: "
                         "a reset reaches them too, so they are drained with it")
        partitions = nodecheck.device_peers(snap, self.gpu)
        if partitions:
            lines.append(f"GPU {self.gpu} is a partition of physical device {snap.gpu(self.gpu).bus_id} with GPU "
                         f"{', '.join(map(str, partitions))}: a reset acts on the whole device, so they are drained "
                         "with it")
        return lines

    def _why_no_reset(self, ctx: RunContext, snap: NodeSnapshot, info) -> tuple[str, str] | None:
        """(why a reset may not be done, the command that allows it), or None when it may."""
        cmd = f"gpuwarden fix {self.gpu}"
        if not self.allow_reset:
            return "--no-reset was given", f"run `{cmd}` to allow one"
        if info.vendor != "sim" and os.geteuid() != 0:
            return "a GPU reset needs root", f"run `sudo {cmd}`"
        try:
            gpureset.choose(info, which=self.which, amdsmi_loader=self.amdsmi_loader)
        except GpuwardenError as exc:  # no tool, no bus id: nothing here can reset this GPU
            return f"no way to reset it here: {exc.message}", exc.hint or "see `gpuwarden reset --help`"
        engine_pids = {e.pid for e in snap.engines if e.pid}
        for g in self._hive:
            others = [p for p in nodecheck.live_users(snap, g) if p.pid not in engine_pids]
            if others:
                return (f"GPU {g} is in use by " + "; ".join(nodecheck.describe(p, g) for p in others[:3]),
                        f"stop it, then run `{cmd}` again")
        if self._engines and not self.stop_engines:
            names = ", ".join(f"{n} (GPU {g})" for n, g in self._engines)
            return f"engine(s) {names} run on it", f"run `{cmd} --stop-engines` to stop them for the reset"
        return None

    def plan(self, ctx: RunContext) -> list[Step]:
        for line in ctx.scratch.get("diagnosis", []):
            ctx.info(line)
        if self._clean:
            self.destructive = False
            return [Step("check", f"check that GPU {self.gpu} stays clean", self._check)]
        steps = [s for s in self._purge.plan(ctx) if s.name != "verify"]
        steps.append(Step("settle", f"wait up to {self.timeout_s:g}s for the purged VRAM to return; a reset "
                                    "is needed only if memory no process holds is left", self._settle))
        if self._no_reset:
            ctx.info(f"no reset will be done: {self._no_reset[0]} ({self._no_reset[1]})")
        else:
            hive = ", ".join(map(str, self._hive))
            stop = f"; stop engine(s) {', '.join(n for n, _ in self._engines)}" if self._engines else ""
            them = "them" if len(self._hive) > 1 else "it"
            steps.append(self._if_reset(Step("drain", f"mark GPU {hive} drained{stop}; wait until no live process "
                                                      f"uses {them}", self._drain, destructive=True)))
            for s in reset_step(ctx.settings, self.gpu, force=False, timeout_s=self.reset_timeout_s,
                                require_drained=True, runner=self.runner, which=self.which,
                                amdsmi_loader=self.amdsmi_loader):
                if s.name == "reset" and self._reach:
                    s.description += f" ({self._reach})"
                steps.append(self._if_reset(s))
            steps.append(self._if_reset(Step("undrain", f"put GPU {hive} back in service (only the drain marks "
                                                        "this fix set)", self._undrain, destructive=True)))
        self.destructive = any(s.destructive for s in steps)
        return steps

    def _if_reset(self, step: Step) -> Step:
        inner = step.action

        def act(ctx: RunContext) -> str | None:
            if not ctx.scratch.get("needs_reset"):
                raise SkipStep(f"GPU {self.gpu} is clean without a reset")
            return inner(ctx)
        return Step(step.name, step.description + " (only if needed)", act, step.destructive)

    # --- steps ---------------------------------------------------------------------------------
    def _check(self, ctx: RunContext) -> str:
        left, holders = nodecheck.residual_left(nodecheck.snapshot(ctx.settings), self.gpu)
        if left is not None or holders:
            raise StepFailed(f"GPU {self.gpu} changed since the plan: residual VRAM appeared",
                             f"run `gpuwarden fix {self.gpu}` again")
        ctx.scratch["outcome"] = f"GPU {self.gpu} was clean: nothing changed"
        return f"GPU {self.gpu} is clean: nothing to do"

    def _settle(self, ctx: RunContext) -> str:
        left = nodecheck.wait_residual_settled(ctx.settings, [self.gpu], self.timeout_s,
                                               settle_s=1.0 if ctx.scratch.get("removed") else 0.0,
                                               cancelled=ctx.cancelled)
        if self.gpu not in left:
            ctx.scratch["outcome"] = f"GPU {self.gpu} is clean and verified (no reset needed)"
            return f"GPU {self.gpu}: no residual VRAM left, no reset needed"
        size, holders = left[self.gpu]
        what = f"{fmt_bytes(size) if size is not None else 'some VRAM'} still held"
        movable = nodecheck.process_holders(holders)
        if movable:
            what += " by " + ", ".join(f"pid {h.pid} ({h.reason})" for h in movable)
        else:
            what += " by no process"
        blocked = self._no_reset
        if blocked is None and any(h.reason == "disk-sleep" for h in movable):
            blocked = ("a process in disk sleep holds it and would survive a reset",
                       f"see `cat /proc/{movable[0].pid}/stack`: it waits on storage or the driver")
        if blocked:
            raise StepFailed(f"GPU {self.gpu}: {what}; not reset: {blocked[0]}", blocked[1])
        ctx.scratch["needs_reset"] = True
        return f"GPU {self.gpu}: {what}: a reset is needed"

    def _drain(self, ctx: RunContext) -> str:
        state_dir = ctx.settings.state_dir
        before = nodestate.drained(state_dir)
        marked = [g for g in self._hive if g not in before]
        for g in marked:
            nodestate.set_drained(state_dir, g, True, who=journal.who(), reason=f"gpuwarden fix {self.gpu}")
        ctx.scratch["drained_by_fix"] = marked
        stopped = []
        if self.stop_engines:
            for name, _ in self._engines:  # the engines the plan named, no other
                r = control.stop(ctx.settings, name, timeout_s=self.grace_s)
                ctx.info(f"engine {r.name}: {r.result}", engine=r.name, result=r.result)
                if r.result != "not-running":
                    stopped.append(r.name)
        ctx.scratch["engines_stopped"] = stopped
        busy = nodecheck.wait_unused(ctx.settings, self._hive, self.timeout_s, cancelled=ctx.cancelled)
        if busy:
            who = "; ".join(nodecheck.describe(p, g) for g, ps in sorted(busy.items()) for p in ps[:3])
            raise StepFailed(f"still in use after {self.timeout_s:g}s: {who}",
                             f"stop it, then run `gpuwarden fix {self.gpu}` again (GPU "
                             f"{', '.join(map(str, marked)) or self.gpu} stays drained meanwhile)")
        done = (f"GPU {self._hive[0]} drained, nothing uses it" if len(self._hive) == 1 else
                f"GPUs {', '.join(map(str, self._hive))} drained, nothing uses them")
        return done + (f"; stopped {', '.join(stopped)}" if stopped else "")

    def _undrain(self, ctx: RunContext) -> str:
        marked = ctx.scratch.get("drained_by_fix", [])
        for g in marked:
            nodestate.set_drained(ctx.settings.state_dir, g, False)
        stopped = ctx.scratch.get("engines_stopped", [])
        if stopped:
            ctx.info("engines stopped for the reset: start them again with "
                     + ", ".join(f"`gpuwarden engines restart {n}`" for n in stopped), engines=stopped)
        kept = [g for g in self._hive if g not in marked]
        ctx.scratch["outcome"] = f"GPU {self.gpu} is clean and verified after a reset" + (
            (f"; GPU {kept[0]} stays drained as before (`gpuwarden undrain {kept[0]}` puts it back)"
             if len(kept) == 1 else
             f"; GPUs {', '.join(map(str, kept))} stay drained as before ("
             + ", ".join(f"`gpuwarden undrain {g}`" for g in kept) + " put them back)")
            if kept else "")
        if not marked:
            raise SkipStep("every GPU was drained before this fix: left drained")
        return f"GPU {', '.join(map(str, marked))} back in service"

