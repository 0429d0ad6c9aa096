"""Post-clean by the node agent: when a pod that held GPUs leaves the kubelet's pod-resources list, its GPUs are
kept from new tenants, checked after a grace, cleaned by the node's policy, verified, and let go.

Tenants need nothing (no sidecar, no hook). The clean is a Cleaner from the playbooks layer (the purge playbook;
a reset only where [kubernetes] post_clean_reset allows it and every GPU the reset reaches is free).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.node.topology import topology
from gpuwarden.ops.k8s.gpucheck import check
from gpuwarden.ops.services.k8s_remediation import FixOutcome

Cleaner = Callable[[int, bool, threading.Event], FixOutcome]  # (gpu, may_reset, cancelled) -> outcome


@dataclass
class Leftover:
    """A GPU whose tenant left: who it was, since when, where its clean stands."""

    gpu: int
    pods: list[str]
    since: float
    phase: str = "waiting"  # waiting -> cleaning -> (verified: gone) | failed
    reason: str = ""
    attempts: int = 0
    history: list[str] = field(default_factory=list)


def free_gpus(snap: NodeSnapshot, assigned: set[int]) -> set[int]:
    """GPUs no live pod was given and no live process uses: a reset may reach them without hurting anyone."""
    busy = set(assigned)
    for p in snap.processes:
        if p.alive:
            busy.update(p.vram)
    return {g.index for g in snap.gpus} - busy


def reset_reaches(snap: NodeSnapshot, gpu: int, sysfs_root: Path) -> set[int]:
    """Every GPU one reset of `gpu` reaches (its device, its XGMI hive: ops/node/topology reset_scope)."""
    row = next((r for r in topology(snap, sysfs_root)["gpus"] if r["index"] == gpu), None)
    return set(row["reset_scope"]) if row else {gpu}


class TenantCleaner:
    """Fed the pods that left (pod-resources) and each snapshot; runs one clean at a time in its own thread."""

    def __init__(self, *, cleaner: Cleaner | None, snapshot: Callable[[], NodeSnapshot], sysfs_root: Path,
                 state_dir: Path | None = None, grace_s: float = 5.0, allow_reset: bool = False,
                 retry_s: float = 60.0, events: Callable[[str, str, str], None] | None = None,
                 log: Callable[[str, str], None] = lambda level, text: None, wake: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic):
        self.cleaner, self.snapshot, self.sysfs_root, self.state_dir = cleaner, snapshot, sysfs_root, state_dir
        self.grace_s, self.allow_reset, self.retry_s = grace_s, allow_reset, retry_s
        self.events = events or (lambda reason, message, kind: None)
        self.log, self.wake, self.clock = log, wake, clock
        self.leftovers: dict[int, Leftover] = {}
        self.cleaned = 0
        self._seen: set[tuple[str, float]] = set()  # (namespace/pod, when it left): each departure once
        self._verified: dict[int, float] = {}  # GPU -> taken_at of the sample that verified it
        self._lock = threading.Lock()
        self._busy: threading.Thread | None = None
        self._cancel = threading.Event()

    # --- what the reconciler reads ------------------------------------------------------------------
    def dirty(self) -> dict[int, str]:
        with self._lock:
            return {g: ("clean-failed" if lo.phase == "failed" else "tenant-left") for g, lo in self.leftovers.items()}

    def take_verified(self) -> dict[int, float]:
        """GPUs verified clean since the last call, with the time of the sample that showed it."""
        with self._lock:
            out, self._verified = self._verified, {}
            return out

    def due_in(self) -> float | None:
        with self._lock:
            waiting = [lo.since + self.grace_s for lo in self.leftovers.values() if lo.phase == "waiting"]
        return max(0.0, min(waiting) - self.clock()) if waiting else None

    def status(self) -> dict[str, object]:
        with self._lock:
            return {"grace_s": self.grace_s, "allow_reset": self.allow_reset, "cleaned": self.cleaned,
                    "gpus": {str(g): {"pods": lo.pods, "phase": lo.phase, "reason": lo.reason}
                             for g, lo in sorted(self.leftovers.items())}}

    def close(self) -> None:
        self._cancel.set()
        if self._busy is not None:
            self._busy.join(10.0)

    # --- the reconciler thread ----------------------------------------------------------------------
    def observe(self, snap: NodeSnapshot, gone: list[tuple[str, tuple[int, ...], float]], assigned: set[int],
                verified: frozenset[int] = frozenset()) -> None:
        """gone: (namespace/pod, its GPUs, when it left the list); assigned: GPUs live pods hold now; verified:
        GPUs a purge, reset or fix verified clean just now (an operator's, or remediation's)."""
        now = self.clock()
        with self._lock:
            settled = [lo for lo in self.leftovers.values() if lo.phase == "failed"
                       and (lo.gpu in verified or (snap.gpu(lo.gpu) is not None and check(snap, [lo.gpu])[0].ok))]
        for lo in settled:  # a failed clean that someone else finished: no need to wait for the retry
            self._lift(lo, "verified clean since (a purge, reset or fix)", snap.taken_at)
        for pod, gpus, left_at in gone:
            if (pod, left_at) in self._seen or not gpus:
                continue
            self._seen.add((pod, left_at))
            # A GPU given to a new pod already (the kubelet was quicker than the exclusion) is that tenant's now:
            # its gpu-check asks about it.
            taken = [g for g in gpus if g not in assigned]
            for g in taken:
                with self._lock:
                    lo = self.leftovers.setdefault(g, Leftover(g, [], now))
                    lo.pods.append(pod)
                    lo.phase, lo.since = ("waiting", now) if lo.phase != "cleaning" else (lo.phase, lo.since)
            if taken:
                self._say("GPUTenantLeft", f"pod {pod} left GPU {', '.join(map(str, taken))}: kept from new tenants "
                          f"until checked clean (in {self.grace_s:g}s)", "Normal", "tenant-left", pod=pod, gpus=taken)
        # Departures the pod-resources view has forgotten (after an hour) cannot come back: forget them too.
        self._seen &= {(pod, left_at) for pod, _, left_at in gone}
        if self._busy is not None and self._busy.is_alive():
            return
        with self._lock:
            due = [lo for lo in self.leftovers.values()
                   if (lo.phase == "waiting" and now - lo.since >= self.grace_s)
                   or (lo.phase == "failed" and now - lo.since >= self.retry_s)]
        for lo in sorted(due, key=lambda x: x.gpu):
            verdict = check(snap, [lo.gpu])[0] if snap.gpu(lo.gpu) is not None else None
            if verdict is not None and verdict.ok:
                self._lift(lo, "checked clean after the grace: nothing to clean", snap.taken_at)
                continue
            reasons = "; ".join(verdict.reasons) if verdict else "not in the snapshot"
            may_reset = False
            if self.allow_reset:
                reach = reset_reaches(snap, lo.gpu, self.sysfs_root)
                free = free_gpus(snap, assigned) | {lo.gpu}
                may_reset = reach <= free
                if not may_reset:
                    lo.history.append(f"no reset: it would reach GPU {', '.join(map(str, sorted(reach - free)))} "
                                      "in use")
            if self.cleaner is None:
                self._fail(lo, f"not clean ({reasons}) and this agent has no clean policy: run `gpuwarden fix "
                               f"{lo.gpu}`")
                continue
            lo.phase, lo.attempts = "cleaning", lo.attempts + 1
            self._busy = threading.Thread(target=self._clean, args=(lo, may_reset, reasons),
                                          name=f"gpuwarden-postclean-{lo.gpu}", daemon=True)
            self._busy.start()
            return  # one clean at a time: the next due GPU goes after it

    def _clean(self, lo: Leftover, may_reset: bool, reasons: str) -> None:
        assert self.cleaner is not None
        self._say("GPUPostClean", f"GPU {lo.gpu} after pod {', '.join(lo.pods)}: {reasons}; cleaning (purge"
                  + (", reset if needed: it reaches only free GPUs" if may_reset else ", no reset") + ")",
                  "Normal", "started", gpus=[lo.gpu], reset_allowed=may_reset)
        try:
            outcome = self.cleaner(lo.gpu, may_reset, self._cancel)
        except Exception as exc:  # a bug in the clean must fail this GPU, not the reconciler
            outcome = FixOutcome(False, f"{type(exc).__name__}: {exc}")
        if self._cancel.is_set():
            return
        fresh = self.snapshot()
        verdict = check(fresh, [lo.gpu])[0] if fresh.gpu(lo.gpu) is not None else None
        if verdict is not None and verdict.ok:
            self._lift(lo, f"cleaned and verified ({outcome.message})", fresh.taken_at)
        else:
            why = "; ".join(verdict.reasons) if verdict else "gone from the snapshot"
            self._fail(lo, f"still not clean after the clean ({outcome.message}): {why}"
                           + ("" if may_reset else "; a reset was not allowed") + f": run `gpuwarden fix {lo.gpu}`")
        self.wake()

    def _lift(self, lo: Leftover, how: str, taken_at: float) -> None:
        with self._lock:
            self.leftovers.pop(lo.gpu, None)
            self._verified[lo.gpu] = max(taken_at, self._verified.get(lo.gpu, taken_at))
            self.cleaned += 1
        self._say("GPUPostCleanVerified", f"GPU {lo.gpu} after pod {', '.join(lo.pods)}: {how}", "Normal", "ok",
                  gpus=[lo.gpu])

    def _fail(self, lo: Leftover, why: str) -> None:
        with self._lock:
            lo.phase, lo.reason, lo.since = "failed", why, self.clock()
        self._say("GPUPostCleanFailed", f"GPU {lo.gpu} after pod {', '.join(lo.pods)}: {why}; it stays excluded",
                  "Warning", "failed", gpus=[lo.gpu])

    def _say(self, reason: str, message: str, kind: str, result: str, **details: object) -> None:
        self.log("warning" if kind == "Warning" else "info", f"kubernetes: {message}")
        self.events(reason, message, kind)
        if self.state_dir is not None:
            journal.write(self.state_dir, "post-clean", result, message=message, **details)
