"""The reset playbook: reset one GPU the vendor's way once it is drained and idle, then verify it came back.

On AMD the other GPUs of its XGMI hive are checked and locked too: the driver resets the hive as one.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable

from gpuwarden.ops.clean import gpureset
from gpuwarden.ops.node import nodestate
from gpuwarden.ops.clean.gpureset import ResetPath
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.signalplan import SignalPlan
from gpuwarden.ops.clean.reaper import command_parts
from gpuwarden.ops.foundation.safetext import bracketed
from gpuwarden.ops.node.topology import reset_reach, topology

from gpuwarden.playbooks import nodecheck
from gpuwarden.playbooks.framework import Playbook, RunContext, Step, StepFailed


def blockers(snap: NodeSnapshot, gpu: int, *, require_drained: bool, drained: dict[int, dict]) -> list[str]:
    """Why GPU `gpu` (and its hive) may not be reset now; empty when it may."""
    problems = []
    partitions = set(nodecheck.device_peers(snap, gpu))
    for g in [gpu, *nodecheck.reset_peers(snap, gpu)]:
        label = f"GPU {g}" if g == gpu else \
            f"GPU {g} (same {'physical device' if g in partitions else 'XGMI hive'} as GPU {gpu}: the reset reaches it)"
        why = nodecheck.unreadable(snap, g)
        if why:
            # A hung GPU is what a reset is for, but not blindly: --force says the operator knows who is on it.
            problems.append(f"{why} (pass --force to reset it all the same)")
            continue
        if require_drained and g not in drained:
            problems.append(f"{label} is not drained (run `gpuwarden drain {g}` first)")
        live = nodecheck.live_users(snap, g)
        if live:
            problems.append(f"{label} is in use by " + "; ".join(nodecheck.describe(p, g) for p in live[:4])
                            + (" ..." if len(live) > 4 else ""))
    return problems


def reset_step(settings: Settings, gpu: int, *, force: bool, timeout_s: float, require_drained: bool,
               runner: gpureset.Runner, which: gpureset.Which, amdsmi_loader: Callable[[], Any]) -> list[Step]:
    """The reset and verify steps; purge --escalate-reset uses the same ones (without the drain rule)."""

    def do_reset(ctx: RunContext) -> str:
        # Look again right before acting: a tenant may have started since the plan was made.
        snap = nodecheck.snapshot(settings)
        info = nodecheck.require_gpu(snap, gpu)
        if not force:
            problems = blockers(snap, gpu, require_drained=require_drained,
                                drained=nodestate.drained(settings.state_dir))
            if problems:
                raise StepFailed("not reset: " + "; ".join(problems), "stop them, or pass --force")
        path = gpureset.choose(info, which=which, amdsmi_loader=amdsmi_loader)
        ctx.info(f"resetting GPU {gpu}: {path.what}", method=path.method)
        done = gpureset.perform(settings, path, runner=runner, amdsmi_loader=amdsmi_loader)
        ctx.scratch.setdefault("reset", []).append({"gpu": gpu, "method": path.method, "call": done})
        return f"GPU {gpu} reset: {done}"

    def verify(ctx: RunContext) -> str:
        before = ctx.scratch.get("identity", {}).get(gpu)
        snap, states = nodecheck.wait_idle(settings, [gpu], timeout_s, cancelled=ctx.cancelled)
        info = snap.gpu(gpu)
        state = states[gpu]
        if info is None or not state.present:
            raise StepFailed(f"GPU {gpu} did not enumerate again within {timeout_s:g}s",
                             "see dmesg; the GPU may need a reboot or a PCI rescan")
        if before and info.bus_id and before != info.bus_id:
            raise StepFailed(f"index {gpu} is now the GPU at {info.bus_id}, not {before}: the GPUs re-enumerated "
                             "in another order", "check `gpuwarden status` before doing anything else")
        if not state.ok:
            raise StepFailed(f"GPU {gpu} is back but not clean: " + "; ".join(state.problems),
                             "see `gpuwarden status`; a residual that survives a reset points at the driver")
        res = next((r for r in snap.residual if r.gpu_index == gpu), None)
        ctx.scratch.setdefault("verified", []).append(gpu)
        base = ("VRAM at baseline" if res is not None and res.baseline is not None
                else "no unexplained VRAM (no baseline recorded)")
        return f"GPU {gpu} enumerates again, {base}, no holders"

    return [
        Step("reset", f"reset GPU {gpu} (every context on it is lost)", do_reset, destructive=True),
        Step("verify", f"verify GPU {gpu}: enumerates again, VRAM at baseline, no residual", verify),
    ]


class ResetPlaybook(Playbook):
    name = "reset"
    destructive = True

    def __init__(self, gpu: int, *, force: bool = False, timeout_s: float = 60.0,
                 runner: gpureset.Runner = gpureset.run_command, which: gpureset.Which = shutil.which,
                 amdsmi_loader: Callable[[], Any] = gpureset.load_amdsmi):
        self.gpu = gpu
        self.force = force
        self.timeout_s = timeout_s
        self.runner, self.which, self.amdsmi_loader = runner, which, amdsmi_loader
        self.description = f"reset GPU {gpu}"
        self._locked = (gpu,)
        self._path: ResetPath | None = None
        self._reach: str | None = None  # "resetting GPU 2 also resets ...", set by preconditions
        # A reset signals no process (it refuses while one uses the GPU, unless --force): an empty, shown plan.
        self.signal_plan = SignalPlan()

    def gpus(self) -> tuple[int, ...]:
        return self._locked

    def summary(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "force": self.force, "gpus_locked": list(self._locked),
                "method": self._path.method if self._path else None}

    def preconditions(self, ctx: RunContext) -> list[str]:
        snap = nodecheck.snapshot(ctx.settings)
        info = nodecheck.require_gpu(snap, self.gpu)
        peers = nodecheck.hive_peers(snap, self.gpu)
        self._locked = (self.gpu, *nodecheck.reset_peers(snap, self.gpu))
        # What the operator confirms: which GPUs (hive, partitions of the device) and engines the reset takes down.
        doc = topology(snap, ctx.settings.sysfs_root)
        self._reach = reset_reach(doc, self.gpu)
        self.confirm_note = self._reach or ""
        self._note_wider_reach(ctx, snap, doc)
        if peers:
            ctx.info(f"GPU {self.gpu} is in XGMI hive {info.hive_id} with GPU(s) {', '.join(map(str, peers))}: "
                     "the reset reaches them too", hive=info.hive_id, peers=peers)
        partitions = nodecheck.device_peers(snap, self.gpu)
        if partitions:
            ctx.info(f"GPU {self.gpu} is a {info.compute_partition or 'partition'} partition of physical device "
                     f"{info.bus_id} with GPU(s) {', '.join(map(str, partitions))}: the reset acts on the whole "
                     "device", bus_id=info.bus_id, partitions=partitions)
        problems = []
        if info.vendor != "sim" and os.geteuid() != 0:
            problems.append("a GPU reset needs root (run it with sudo)")
        if not self.force:
            drained = nodestate.drained(ctx.settings.state_dir)
            problems += blockers(snap, self.gpu, require_drained=True, drained=drained)
        try:
            self._path = gpureset.choose(info, which=self.which, amdsmi_loader=self.amdsmi_loader)
        except Exception as exc:  # no tool, no bus id: the plan cannot name a way to reset
            problems.append(str(exc))
        ctx.scratch["identity"] = {self.gpu: info.bus_id}
        return problems

    def _note_wider_reach(self, ctx: RunContext, snap: Any, doc: dict[str, Any]) -> None:
        """What else a reset reaches (catalog amd-smi-reset-reach): GPUs behind the same PCIe switch may be
        disturbed (AMD: the blast radius depends on the PCIe topology), and every process using a GPU the reset
        takes down is told its GPU memory is lost (kfd_events.c kfd_signal_reset_event): named before it runs."""
        row = next((r for r in doc["gpus"] if r["index"] == self.gpu), None)
        if row is None:
            return
        switch_peers = [i for i in row["same_pcie_parent"] if i != self.gpu and i not in self._locked]
        if switch_peers:
            ctx.info(f"GPU(s) {', '.join(map(str, switch_peers))} sit behind the same PCIe bridge "
                     f"({row['pcie_parent']}): a reset is not known to reach them, but AMD says the reach depends on "
                     "the PCIe topology (`gpuwarden known amd-smi-reset-reach`); watch them afterwards",
                     switch_peers=switch_peers, pcie_parent=row["pcie_parent"])
        users = sorted({p.pid: p for g in self._locked for p in nodecheck.users(snap, g)}.values(),
                       key=lambda p: p.pid)
        if users:
            named = ", ".join(f"pid {p.pid} ({_program_first(p.pid, p.command, ctx.settings.proc_root)})"
                              for p in users[:8])
            more = f" and {len(users) - 8} more" if len(users) > 8 else ""
            line = (f"{len(users)} process(es) using GPU(s) {', '.join(map(str, self._locked))} lose their GPU memory "
                    f"in the reset (KFD signals 'memory lost' to each): {named}{more}")
            ctx.info(line, pids=[p.pid for p in users])
            self.confirm_note = "; ".join(x for x in (self.confirm_note, line) if x)

    def plan(self, ctx: RunContext) -> list[Step]:
        steps = reset_step(ctx.settings, self.gpu, force=self.force, timeout_s=self.timeout_s,
                           require_drained=True, runner=self.runner, which=self.which,
                           amdsmi_loader=self.amdsmi_loader)
        if self._path is not None:
            steps[0].description += f" via {self._path.what}"
        if self._reach:
            steps[0].description += f" ({self._reach})"
        return steps


def _program_first(pid: int, fallback: str, proc_root: Any) -> str:
    """The process's redacted command line, program name first, cut at the tail (as the signal plans show it)."""
    program, command = command_parts(pid, proc_root)
    text = command if program != "?" else bracketed(fallback)
    return text if len(text) <= 60 else text[:59] + "…"
