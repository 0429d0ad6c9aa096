"""The node's signal to the scheduler: condition GPUResidualVRAM, and the taint gpuwarden.io/gpu-unhealthy.

A reconciler fed one snapshot per sample: it patches only what changed (a quiet node costs no calls but a
heartbeat every few minutes), taints after a grace, untaints only once the GPUs are verified clean, and
never touches a taint it did not set. RBAC refusals and outages become one line in `problem`, retried later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from gpuwarden.ops.config.kubernetes import POLICIES
from gpuwarden.ops.foundation.jsondoc import iso
from gpuwarden.ops.foundation.model import Holder, NodeSnapshot
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.k8s.kube import Kube, KubeError
from gpuwarden.ops.k8s.objects import Node, Taint

CONDITION = "GPUResidualVRAM"
TAINT_KEY = "gpuwarden.io/gpu-unhealthy"
# Set with our taint, removed with it: a taint with our key but without this annotation is someone else's.
OWNER_ANNOTATION = "gpuwarden.io/taint-set-by"
OWNER = "gpuwarden-agent"
HELD_TAINT = "remediation-failed"  # the taint's value while a failed remediation holds the node (ops/services/k8s_remediation)


@dataclass(frozen=True)
class GpuTrouble:
    """Why one GPU is not fit for a new tenant."""

    gpu: int
    reason: str  # "residual-vram" or "reset-needed"
    residual: int | None
    holders: tuple[str, ...] = ()
    last_tenants: tuple[str, ...] = ()  # deleted pods the kubelet last gave this GPU to (an ownerless leak's lead)

    def describe(self) -> str:
        size = fmt_bytes(self.residual) if self.residual else "residual"
        what = f"GPU {self.gpu}: {size}" + (" (a reset failed: needs a reset)" if self.reason == "reset-needed" else "")
        if self.holders:
            what += " held by " + ", ".join(self.holders[:3]) + (" ..." if len(self.holders) > 3 else "")
        elif self.reason == "residual-vram":
            what += " held by no process"
            if self.last_tenants:
                what += " (last given to pod " + ", ".join(self.last_tenants[:2]) + ", deleted)"
        return what


def holder_text(h: Holder) -> str:
    who = f"pid {h.pid} ({h.reason})" if h.pid is not None else h.reason
    if h.pod:
        who += f" of pod {h.namespace}/{h.pod}" + (" (deleted)" if h.pod_deleted_at else "")
    return who


def assess(snap: NodeSnapshot, reset_needed: frozenset[int] = frozenset()) -> dict[int, GpuTrouble]:
    """GPUs holding residual VRAM or dead holders, or waiting for a reset."""
    out: dict[int, GpuTrouble] = {}
    for r in snap.residual:
        if r.significant or r.holders or r.gpu_index in reset_needed:
            reason = "reset-needed" if r.gpu_index in reset_needed else "residual-vram"
            last = () if r.holders else tuple(f"{p.namespace}/{p.pod}" for p in snap.pods
                                               if p.deleted_at is not None and r.gpu_index in p.gpus)
            out[r.gpu_index] = GpuTrouble(r.gpu_index, reason, r.residual if r.significant else None,
                                          tuple(holder_text(h) for h in r.holders), last)
    for g in reset_needed:
        out.setdefault(g, GpuTrouble(g, "reset-needed", None))
    return out


def condition_for(trouble: dict[int, GpuTrouble], gpu_count: int) -> tuple[str, str, str]:
    """(status, reason, message) of the GPUResidualVRAM condition for these troubles: the agent writes it,
    and `gpu-check --node` (node-problem-detector's plugin) says the same."""
    if not trouble:
        return "False", "NoResidualVRAM", f"no residual VRAM on the node's {gpu_count} GPU(s)"
    reason = "ResetNeeded" if any(t.reason == "reset-needed" for t in trouble.values()) else "ResidualVRAM"
    return "True", reason, "; ".join(trouble[g].describe() for g in sorted(trouble))


class NodeSignal:
    """Keeps the condition and the taint of one node in step with the snapshots it is fed."""

    def __init__(self, kube: Kube, node_name: str, *, policy: str = "taint", taint_after_s: float = 120.0,
                 clear_after_s: float = 10.0, heartbeat_s: float = 300.0, retry_s: float = 30.0,
                 events: Callable[[str, str, str], None] | None = None,
                 log: Callable[[str, str], None] = lambda level, text: None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.kube = kube
        self.node_name = node_name
        self.policy = policy
        self.taint_after_s = taint_after_s
        self.clear_after_s = clear_after_s
        self.heartbeat_s = heartbeat_s
        self.retry_s = retry_s
        self.events = events or (lambda reason, message, kind: None)
        self.log = log
        self.clock, self.wall = clock, wall
        self.problem: str | None = None
        self.trouble: dict[int, GpuTrouble] = {}
        self.tainted: str | None = None  # the value of our taint on the node, None when off
        self.condition: dict[str, str | None] | None = None  # what we last wrote (or found at start)
        self.foreign_taint = False
        # Set by a failed remediation (its reason): the condition says it and the taint stays HELD_TAINT
        # whatever the samples say, until the remediation clears it.
        self.held: str | None = None
        # Set while a remediation runs (cordon to uncordon): the taint stays until it has verified the GPUs.
        self.keep = False
        # GPUs a per-GPU exclusion (a DeviceTaintRule) keeps from new tenants: their trouble needs no node taint.
        self.covered: frozenset[int] = frozenset()
        self._bad_since: dict[int, float] = {}
        self._clean_since: float | None = None
        self._written_at = float("-inf")
        self._retry_at = float("-inf")
        self._started = False

    # ------------------------------------------------------------------------------------------
    def observe(self, snap: NodeSnapshot, *, reset_needed: frozenset[int] = frozenset(),
                verified: frozenset[int] = frozenset()) -> None:
        """One sample: work out what the node should say, and say it if it does not already."""
        if self.policy == "off" and self.tainted is None:
            return  # off: the node is not touched (a taint of ours from before a reload is still removed below)
        now = self.clock()
        trouble = assess(snap, reset_needed)
        for g in list(self._bad_since):
            if g not in trouble:
                del self._bad_since[g]
        for g in trouble:
            self._bad_since.setdefault(g, now)
        if trouble:
            self._clean_since = None
        elif self._clean_since is None:
            self._clean_since = now
        self.trouble = trouble
        if now < self._retry_at:
            return
        try:
            if not self._started:
                self._start()
            if self.policy != "off":
                self._reconcile_condition(trouble, now, len(snap.gpus))
            if self.policy == "taint":
                self._reconcile_taint(trouble, now, verified)
            elif self.tainted is not None:
                # The policy went from taint to condition: a taint of ours would otherwise stay forever.
                self._set_taint(None, f"removed {TAINT_KEY}: the policy is now {self.policy!r}")
            if self.problem is not None:
                self.log("ok", f"kubernetes: node {self.node_name}: working again")
            self.problem = None
        except KubeError as exc:
            line = exc.line()
            if line != self.problem:
                self.log("error", f"kubernetes: node {self.node_name}: {line}")
            self.problem = line
            self._retry_at = now + exc.retry_in(self.retry_s)

    def bad_for(self, now: float | None = None) -> dict[int, float]:
        """Seconds each GPU in trouble has been so (the remediation's grace counts from there)."""
        now = self.clock() if now is None else now
        return {g: now - t for g, t in self._bad_since.items()}

    def due_in(self) -> float | None:
        """Seconds until a GPU's grace runs out (None: nothing pending): the sampler should look again then,
        so the taint comes at the grace, not up to one sample interval after it."""
        if self.policy != "taint" or self.tainted is not None or self.foreign_taint or not self._bad_since:
            return None
        pending = [t for g, t in self._bad_since.items() if g not in self.covered]
        if not pending:
            return None
        due = max(min(pending) + self.taint_after_s, self._retry_at)  # not before a retry
        return max(0.0, due - self.clock())

    def status(self) -> dict[str, object]:
        """For the agent's status: what the node says now and what went wrong last."""
        return {"node": self.node_name, "policy": self.policy,
                "condition": self.condition, "taint": self.tainted, "foreign_taint": self.foreign_taint,
                "gpus_in_trouble": sorted(self.trouble), "problem": self.problem, "held": self.held}

    # ------------------------------------------------------------------------------------------
    def _start(self) -> None:
        node = self.kube.node(self.node_name)
        for c in (node.get("status") or {}).get("conditions") or ():
            if c.get("type") == CONDITION:
                self.condition = {"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason"),
                                  "message": c.get("message"), "lastTransitionTime": c.get("lastTransitionTime")}
        self._learn_taint(node)
        self._started = True

    def _learn_taint(self, node: Node) -> list[Taint]:
        taints = (node.get("spec") or {}).get("taints") or []
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        ours = [t for t in taints if t.get("key") == TAINT_KEY]
        owned = annotations.get(OWNER_ANNOTATION) == OWNER
        self.foreign_taint = bool(ours) and not owned
        self.tainted = ours[0].get("value", "") if ours and owned else None
        return taints

    def _reconcile_condition(self, trouble: dict[int, GpuTrouble], now: float, gpu_count: int) -> None:
        status, reason, message = condition_for(trouble, gpu_count)
        if self.held:
            status, reason = "True", "RemediationFailed"
            message = f"remediation failed: {self.held}" + (f"; {message}" if trouble else "")
        old = self.condition or {}
        same = (old.get("status"), old.get("reason"), old.get("message")) == (status, reason, message)
        if same and now - self._written_at < self.heartbeat_s:
            return
        transition = old.get("lastTransitionTime") if old.get("status") == status else None
        stamp = iso(self.wall())
        cond: dict[str, str | None] = {"type": CONDITION, "status": status, "reason": reason, "message": message[:1024],
                "lastTransitionTime": transition or stamp}
        # Conditions merge by type (strategic merge patch): the kubelet's own are never touched.
        self.kube.patch_node_status(self.node_name, {"status": {"conditions": [{**cond, "lastHeartbeatTime": stamp}]}})
        self._written_at = now
        if old.get("status") != status and (old or trouble):
            self.events("GPUResidualVRAM" if trouble else "GPUResidualVRAMCleared", message,
                        "Warning" if trouble else "Normal")
        self.condition = cond

    def _reconcile_taint(self, trouble: dict[int, GpuTrouble], now: float, verified: frozenset[int]) -> None:
        if self.held:
            if self.tainted != HELD_TAINT and not self.foreign_taint:
                self._set_taint(HELD_TAINT, f"tainted {TAINT_KEY}={HELD_TAINT}:NoSchedule: {self.held}")
            return
        handed = sorted(g for g in trouble if g in self.covered)
        trouble = {g: t for g, t in trouble.items() if g not in self.covered}
        if handed and not trouble and self.tainted is not None and not self.keep and not self.foreign_taint:
            # Set before the per-GPU rules were in place: they keep those GPUs from new tenants now.
            self._set_taint(None, f"removed {TAINT_KEY}: DeviceTaintRules keep GPU {', '.join(map(str, handed))} "
                                  "from new tenants; the node's other GPUs stay schedulable")
            return
        due = [g for g, t in trouble.items()
               if t.reason == "reset-needed" or now - self._bad_since.get(g, now) >= self.taint_after_s]
        if due:
            value = "reset-needed" if any(trouble[g].reason == "reset-needed" for g in due) else "residual-vram"
            if self.tainted != value and not self.foreign_taint:
                why = "; ".join(trouble[g].describe() for g in sorted(due))
                self._set_taint(value, f"tainted {TAINT_KEY}={value}:NoSchedule: {why}")
            return
        if self.tainted is None or trouble or self.keep:
            return  # nothing set, or still in trouble (within the grace for GPUs that came since)
        # Off only once verified: a purge or reset said so, or the node stayed clean for clear_after_s.
        clean_for = now - self._clean_since if self._clean_since is not None else 0.0
        if clean_for >= self.clear_after_s or verified:
            how = "a verified purge/reset" if verified else f"clean for {clean_for:.0f}s"
            self._set_taint(None, f"removed {TAINT_KEY}: the GPUs hold no residual VRAM ({how})")

    def _set_taint(self, value: str | None, why: str) -> None:
        def change(node: Node) -> Node | None:
            taints = self._learn_taint(node)
            if self.foreign_taint or self.tainted == value:
                return None
            others = [t for t in taints if t.get("key") != TAINT_KEY]
            mine: list[Taint] = [{"key": TAINT_KEY, "value": value, "effect": "NoSchedule"}] if value else []
            # spec.taints is an atomic list: the patch carries every taint, ours changed and the rest as read.
            return {"metadata": {"annotations": {OWNER_ANNOTATION: OWNER if value else None}},
                    "spec": {"taints": others + mine}}
        if self.kube.update_node(self.node_name, change) is None:
            if self.foreign_taint:
                self.log("warning", f"kubernetes: node {self.node_name} has a {TAINT_KEY} taint gpuwarden did "
                                    "not set: leaving it as it is")
            return
        self.tainted = value
        self.log("warning" if value else "ok", f"kubernetes: node {self.node_name}: {why}")
        self.events("GPUTainted" if value else "GPUUntainted", why, "Warning" if value else "Normal")
