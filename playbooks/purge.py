"""The purge playbook: remove what keeps residual VRAM (zombies, their careless parents), then verify it is gone.

Optionally removes arena files nobody maps and drops the page cache; an ownerless leak is named, and reset
with --escalate-reset.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from gpuwarden.ops.clean import gpureset
from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.model import Holder, NodeSnapshot
from gpuwarden.ops.clean.reaper import Reaper, Target, container_managed, target_ticks
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.arena import format as arena_format
from gpuwarden.ops.arena.mappers import find_mappers

from gpuwarden.playbooks import nodecheck
from gpuwarden.playbooks.cli.status_text import bracketed
from gpuwarden.playbooks.framework import Playbook, RunContext, SkipStep, Step, StepFailed
from gpuwarden.playbooks.reset import reset_step

NO_PROCESS = nodecheck.NO_PROCESS


def _holders_in_scope(snap: NodeSnapshot, gpus: list[int]) -> list[Holder]:
    seen: dict[int | None, Holder] = {}
    for r in snap.residual:
        if r.gpu_index not in gpus:
            continue
        for h in r.holders:
            key = h.pid if h.pid is not None else id(h)
            seen.setdefault(key, h)
    return list(seen.values())


class PurgePlaybook(Playbook):
    name = "purge"
    destructive = True

    def __init__(self, gpu: int | None = None, *, arenas: bool = False, arena_paths: tuple[str, ...] = (),
                 drop_caches: bool = False, escalate_reset: bool = False, grace_s: float = 5.0,
                 timeout_s: float = 10.0, reset_timeout_s: float = 60.0,
                 runner: gpureset.Runner = gpureset.run_command, which: gpureset.Which = shutil.which,
                 amdsmi_loader: Callable[[], Any] = gpureset.load_amdsmi, dead_only: bool = False):
        self.gpu = gpu
        # dead_only: zombies only, and their parents only asked to reap (SIGCHLD): never a live process.
        self.dead_only = dead_only
        self.arenas = arenas or bool(arena_paths)
        self.arena_paths = tuple(arena_paths)
        self.drop_caches = drop_caches
        self.escalate_reset = escalate_reset
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.runner, self.which, self.amdsmi_loader = runner, which, amdsmi_loader
        self.description = (f"purge GPU {gpu}" if gpu is not None else "purge every GPU") + \
            ": remove what holds residual VRAM, then verify it is gone"
        self._scope: list[int] = [] if gpu is None else [gpu]
        self._targets: list[Target] = []
        self._reported: list[str] = []
        self._leaky: list[int] = []
        self._peers: list[int] = []  # XGMI hive peers an escalated reset would reach: locked too

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(set(self._scope) | set(self._peers)))

    def summary(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "arenas": self.arenas, "drop_caches": self.drop_caches,
                "escalate_reset": self.escalate_reset, "gpus_locked": list(self.gpus()),
                **({"dead_only": True} if self.dead_only else {})}

    # --- planning ------------------------------------------------------------------------------
    def preconditions(self, ctx: RunContext) -> list[str]:
        snap = nodecheck.snapshot(ctx.settings)
        self._scope = nodecheck.scope(snap, self.gpu)
        # The same object may be planned twice (a dry run, then the run): start each plan afresh.
        self._targets, self._reported, self._leaky, self._peers = [], [], [], []
        proc_root = ctx.settings.proc_root
        for h in _holders_in_scope(snap, self._scope):
            gpus = ",".join(map(str, h.gpus)) or "?"
            size = fmt_bytes(h.vram_bytes) if h.vram_bytes is not None else "size unknown"
            if h.pid is None or h.reason in NO_PROCESS:
                self._reported.append(f"pid {h.pid if h.pid is not None else '-'} on GPU {gpus} ({h.reason}, "
                                      f"{size}): no process to remove; only a GPU reset frees it")
                continue
            ticks = target_ticks(h.pid, h.start_time, proc_root)
            if ticks is None:
                self._reported.append(f"pid {h.pid} on GPU {gpus}: gone, or its PID now names another process")
                continue
            if (self.dead_only and h.reason != "zombie") or h.reason == "gem-buffers":  # a live DRM client: ask
                self._reported.append(f"pid {h.pid} on GPU {gpus} ({h.reason}): left to an operator")
                continue
            self._targets.append(Target(h.pid, ticks, h.reason, h.command or "", h.gpus, h.vram_bytes))
        if not self.dead_only:
            self._targets += self._container_orphans(snap, proc_root)
        for g in self._scope:
            left, holders = nodecheck.residual_left(snap, g)
            if left is not None or any(h.reason in NO_PROCESS for h in holders):
                self._leaky.append(g)
                if not holders:
                    self._reported.append(f"GPU {g}: {fmt_bytes(left)} held by no process (an ownerless leak)")
        if self.escalate_reset:
            self._peers = [p for g in self._leaky for p in nodecheck.hive_peers(snap, g)]
        ctx.scratch["arena_candidates"] = self._arena_candidates(ctx, snap) if self.arenas else []
        return []

    def _container_orphans(self, snap: NodeSnapshot, proc_root: Path) -> list[Target]:
        """Live GPU users from a container whose runtime shim is gone: tenants nobody will ever stop."""
        out = []
        for p in snap.processes:
            if not p.alive or p.state == "disk-sleep" or not p.container:
                continue
            gpus = tuple(g for g in self._scope if any(u.pid == p.pid for u in nodecheck.users(snap, g)))
            if not gpus or container_managed(p.pid, proc_root):
                continue
            ticks = target_ticks(p.pid, p.start_time, proc_root)
            if ticks is not None:
                out.append(Target(p.pid, ticks, "container-orphan", f"container {p.container}: {p.command}",
                                  gpus, sum(p.vram.get(g, 0) for g in gpus) or None))
        return out

    def _arena_candidates(self, ctx: RunContext, snap: NodeSnapshot) -> list[str]:
        paths = [a.path for a in snap.arenas if not a.mappers]
        for p in self.arena_paths:
            if p not in paths:
                paths.append(str(Path(p)))
        return paths

    def plan(self, ctx: RunContext) -> list[Step]:
        steps: list[Step] = []
        for line in self._reported:
            ctx.info(line)
        for t in self._targets:
            gpus = ",".join(map(str, t.gpus)) or "?"
            size = fmt_bytes(t.vram_bytes) if t.vram_bytes is not None else "VRAM"
            how = {"zombie": "reap zombie", "disk-sleep": "report D-state process",
                   "container-orphan": "end orphan of a gone container:"}.get(t.reason, "remove")
            steps.append(Step(f"pid-{t.pid}", f"{how} pid {t.pid} holding {size} on GPU {gpus} "
                                              + bracketed(t.command[:50]), self._remover(t),
                              destructive=t.reason != "disk-sleep", continue_on_failure=True))
        if self.arenas:
            cands = ctx.scratch.get("arena_candidates", [])
            steps.append(Step("arenas", "remove arena files no process maps"
                              + (f" ({', '.join(cands)})" if cands else " (none found now)"),
                              self._remove_arenas, destructive=True, continue_on_failure=True))
        if self.drop_caches:
            steps.append(Step("drop-caches", "drop the page cache (sync, then 3 > /proc/sys/vm/drop_caches)",
                              self._drop_caches, destructive=True, continue_on_failure=True))
        steps.append(Step("verify", f"verify the residual on GPU {', '.join(map(str, self._scope))} is gone "
                                    f"(up to {self.timeout_s:g}s)", self._verify,
                          continue_on_failure=self.escalate_reset))
        if self.escalate_reset:
            for g in self._leaky:
                for s in reset_step(ctx.settings, g, force=False, timeout_s=self.reset_timeout_s,
                                    require_drained=False, runner=self.runner, which=self.which,
                                    amdsmi_loader=self.amdsmi_loader):
                    steps.append(self._only_if_left(g, s))
        return steps

    # --- steps ---------------------------------------------------------------------------------
    def _remover(self, target: Target):
        def act(ctx: RunContext) -> str:
            reaper = Reaper(ctx.settings, grace_s=self.grace_s, progress=lambda m: ctx.info(m),
                            end_parents=not self.dead_only)
            out = reaper.handle(target)
            ctx.scratch.setdefault("removed" if out.ok else "remaining", []).append(
                {"pid": out.pid, "reason": out.reason, "result": out.result, "detail": out.detail,
                 "next_step": out.next_step, "signals": out.signals})
            if out.result == "skipped":
                raise SkipStep(f"pid {target.pid}: {out.detail}")
            if not out.ok:
                raise StepFailed(f"pid {target.pid}: {out.detail}", out.next_step)
            return f"pid {target.pid}: {out.detail}"
        return act

    def _remove_arenas(self, ctx: RunContext) -> str:
        removed, kept = [], []
        for path in ctx.scratch.get("arena_candidates", []):
            if not arena_format.has_magic(path):
                kept.append(f"{path} (not a readable arena file: not gpuwarden's to delete)")
                continue
            # Check again right before unlinking: an engine may have mapped it since the plan.
            mappers = find_mappers(path, ctx.settings.proc_root, with_usage=False)
            if mappers:
                kept.append(f"{path} (mapped by pid {', '.join(str(m.pid) for m in mappers)})")
                continue
            size = os.path.getsize(path)
            os.unlink(path)
            journal.write(ctx.settings.state_dir, "arena-remove", "ok", path=path, bytes=size)
            removed.append(f"{path} ({fmt_bytes(size)})")
        ctx.scratch["arenas_removed"], ctx.scratch["arenas_kept"] = removed, kept
        for k in kept:
            ctx.info(f"kept {k}")
        if not removed:
            raise SkipStep("no unmapped arena file to remove" + (f"; kept {len(kept)}" if kept else ""))
        return "removed " + ", ".join(removed)

    def _drop_caches(self, ctx: RunContext) -> str:
        if os.geteuid() != 0:
            raise SkipStep("dropping the page cache needs root: run `sudo gpuwarden purge --drop-caches`")
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        journal.write(ctx.settings.state_dir, "drop-caches", "ok")
        return "page cache dropped"

    def _verify(self, ctx: RunContext) -> str:
        # With nothing removed, an ownerless leak will not go by itself: one short look is enough.
        timeout = self.timeout_s if self._targets else min(self.timeout_s, 1.0)
        left = nodecheck.wait_residual_gone(ctx.settings, self._scope, timeout, cancelled=ctx.cancelled)
        ctx.scratch["residual_left"] = {g: v[0] for g, v in left.items()}
        if not left:
            return f"no residual VRAM left on GPU {', '.join(map(str, self._scope))}"
        parts, ownerless = [], []
        for g, (size, holders) in sorted(left.items()):
            who = ", ".join(f"pid {h.pid} ({h.reason})" for h in holders
                            if h.pid is not None and h.reason not in NO_PROCESS)
            ghosts = ", ".join(f"pid {h.pid}" for h in holders if h.pid is not None and h.reason in NO_PROCESS)
            held = (f" by {who}" if who else " by no process") + (f" (the driver still charges {ghosts}, "
                                                                   "which no longer exist)" if ghosts else "")
            parts.append(f"GPU {g}: {fmt_bytes(size) if size is not None else 'some'} still held{held}")
            if not who:
                ownerless.append(g)
        ctx.scratch["ownerless"] = ownerless
        if ownerless and not self.escalate_reset:
            hint = ("no holder is left: only a GPU reset frees it — next step: "
                    + "; ".join(f"`gpuwarden fix {g}`" for g in ownerless)
                    + " (drains, resets, verifies and undrains)")
        elif len(ownerless) == len(parts):
            ctx.info("; ".join(parts))
            return f"only ownerless residual left on GPU {', '.join(map(str, ownerless))}: escalating to a reset"
        else:
            hint = "see the steps above for why a holder could not be removed"
        raise StepFailed("; ".join(parts), hint)

    def _only_if_left(self, gpu: int, step: Step) -> Step:
        inner = step.action

        def act(ctx: RunContext) -> str | None:
            if gpu not in ctx.scratch.get("ownerless", []):
                raise SkipStep(f"GPU {gpu} has no ownerless residual left: no reset needed")
            return inner(ctx)
        return Step(f"{step.name}-gpu{gpu}", step.description, act, step.destructive)
