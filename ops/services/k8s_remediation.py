"""Remediation with proof ([kubernetes] remediate = true): a GPU whose trouble outlasts the grace gets a cluster
slot, a cordon, evictions of the pods its reset reaches, a fix (purge -> reset -> verify) and, only once a fresh
sample says it is clean, the uncordon and the end of the taint.

Every step is an Event on the node and a journal line; the step in progress lives in the node annotation
gpuwarden.io/remediation, so an agent that restarts mid-loop resumes it, and a failed one says why the node
stays cordoned (in the annotation, the condition, the taint's value and an Event).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.jsondoc import iso
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.node.topology import topology
from gpuwarden.ops.k8s.evict import CORDON_ANNOTATION
from gpuwarden.ops.k8s.kube import Forbidden, Kube, KubeError, NotFoundError, TooManyRequests
from gpuwarden.ops.k8s.objects import Node, Pod
from gpuwarden.ops.k8s.nodesignal import GpuTrouble, assess
from gpuwarden.ops.k8s.remediationslots import ClusterSlots, parse_stamp

STATE_ANNOTATION = "gpuwarden.io/remediation"  # JSON: phase, gpus, slot, started, cordoned, reason
LAST_ANNOTATION = "gpuwarden.io/last-remediation"  # when the last one started: the per-node rate limit
CORDON_OWNER = "gpuwarden-remediation"  # the value of gpuwarden.io/cordoned-by on a cordon of ours
GPU_RESOURCES = ("amd.com/gpu", "nvidia.com/gpu")
RESUMABLE = ("cordon", "evict", "fix", "lift")
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class FixOutcome:
    """What the fix playbook said for one GPU: ok only when it verified the GPU clean."""

    ok: bool
    message: str


Fixer = Callable[[int, threading.Event], FixOutcome]  # (gpu, cancelled) -> outcome; runs the real playbook
Emit = Callable[[str, str, str], None]  # (reason, message, Normal|Warning): an Event on the node
Log = Callable[[str, str], None]


@dataclass(frozen=True)
class Victim:
    """A pod to evict before the reset, and why."""

    namespace: str
    name: str
    uid: str | None
    why: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class Failed(Exception):
    """A step could not be done: the node stays cordoned and tainted with this reason."""


class Interrupted(Exception):
    """The agent is stopping: the annotation keeps the step, a restarted agent resumes it."""


def _ranges(gpus: list[int] | set[int]) -> str:
    return ", ".join(map(str, sorted(gpus)))


def _requests_gpu(pod: Pod, resources: tuple[str, ...]) -> bool:
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        res = c.get("resources") or {}
        for table in (res.get("limits") or {}, res.get("requests") or {}):
            if any(name in table and str(table[name]) not in ("0", "") for name in resources):
                return True
    return False


def select_victims(snap: NodeSnapshot, pods: list[Pod], gpus: list[int], sysfs_root: Path,
                   resources: tuple[str, ...] = GPU_RESOURCES) -> tuple[list[Victim], list[str], set[int], bool]:
    """(pods to evict, pods left running and why, the GPUs the reset reaches, whether that is every GPU).

    The reset of a GPU reaches its physical device and its XGMI hive (ops/node/topology: reset_scope); when that is
    every GPU of the node, every pod with a GPU goes. A GPU pod whose GPU is unknown (the kubelet's pod-resources
    API did not say) goes too: a reset under it would take its contexts."""
    doc = topology(snap, sysfs_root)
    scope: set[int] = set()
    for g in gpus:
        row = next((r for r in doc["gpus"] if r["index"] == g), None)
        scope |= set(row["reset_scope"]) if row else {g}
    every = {g.index for g in snap.gpus}
    whole = len(every) > 1 and scope >= every
    assigned: dict[tuple[str, str], set[int]] = {}
    for p in snap.pods:
        if p.deleted_at is None:
            assigned.setdefault((p.namespace, p.pod), set()).update(p.gpus)
    running: dict[tuple[str, str], set[int]] = {}
    for proc in snap.processes:
        if proc.pod and proc.namespace and proc.alive:
            running.setdefault((proc.namespace, proc.pod), set()).update(proc.vram)
    victims, left = [], []
    for obj in pods:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # finished: it holds no GPU
        on = assigned.get(key, set()) | running.get(key, set())
        wants = _requests_gpu(obj, resources)
        if whole:
            why = f"GPU {_ranges(on)}" if on else ("a GPU" if wants else None)
        elif on & scope:
            why = f"GPU {_ranges(on & scope)}"
        elif wants and key not in assigned and not on:
            why = "a GPU the kubelet did not name (pod-resources)"
        else:
            why = None
        if why is None:
            continue
        ref = f"{key[0]}/{key[1]}"
        if (meta.get("annotations") or {}).get("kubernetes.io/config.mirror"):
            left.append(f"{ref} (a static pod: the kubelet runs it whatever the API says)")
        elif any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or ()):
            left.append(f"{ref} (a DaemonSet's pod: a cordon does not keep it off the node)")
        else:
            victims.append(Victim(key[0], key[1], meta.get("uid"), why))
    return sorted(victims, key=lambda v: v.ref), left, scope, whole


class Remediator:
    """Owns the remediation loop of one node in a thread of its own; fed by the node signal's reconciler."""

    def __init__(self, kube: Kube, node_name: str, *, state_dir: Path, sysfs_root: Path, fixer: Fixer,
                 snapshot: Callable[[], NodeSnapshot], lift: Callable[[NodeSnapshot, frozenset[int]], str | None],
                 hold: Callable[[str | None], None], slots: ClusterSlots, events: Emit,
                 log: Log = lambda level, text: None, after_s: float = 600.0, interval_s: float = 3600.0,
                 eviction_timeout_s: float = 300.0, clear_after_s: float = 10.0, backoff_s: float = 1.0,
                 poll_s: float = 0.5, retry_s: float = 10.0, wait_poll_s: float = 5.0, resources: tuple[str, ...] = GPU_RESOURCES,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.kube, self.node_name = kube, node_name
        self.state_dir, self.sysfs_root = Path(state_dir), Path(sysfs_root)
        self.fixer, self.snapshot, self.lift, self.hold = fixer, snapshot, lift, hold
        self.slots, self.events, self.log = slots, events, log
        self.after_s, self.interval_s, self.eviction_timeout_s = after_s, interval_s, eviction_timeout_s
        self.clear_after_s, self.backoff_s, self.poll_s, self.retry_s = clear_after_s, backoff_s, poll_s, retry_s
        self.wait_poll_s = wait_poll_s  # how often a waiting node asks for a slot again (API cost)
        self.resources = resources
        self.clock, self.wall = clock, wall
        self.phase = "idle"  # idle, rate-limited, waiting-slot, cordon, evict, fix, lift, failed
        self.gpus: list[int] = []
        self.reason: str | None = None  # why the node is held (failed) or waits
        self.problem: str | None = None  # the last API trouble
        self.done = 0
        self.failed = 0
        self._latest: tuple[NodeSnapshot | None, dict[int, GpuTrouble], dict[int, float]] = (None, {}, {})
        self._resume: dict[str, Any] | None = None
        self._recovered = False
        self._said: str | None = None  # the last waiting message sent as an Event (one per episode)
        self._clean_since: float | None = None
        self._next_try = float("-inf")  # a waiting node asks again from then on
        self._checked_at = float("-inf")  # a failed one looks at its annotation then
        self._renewed_at = float("-inf")
        self._verified: NodeSnapshot | None = None  # the fresh sample that proved the GPUs clean
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- life cycle (the agent's threads) --------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuwarden-remediation", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop after the step in progress (a playbook step or an API call); what is left is resumed later."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def offer(self, snap: NodeSnapshot, trouble: dict[int, GpuTrouble], bad_for: dict[int, float]) -> None:
        """The reconciler's latest view (quick: the work happens in the remediation thread)."""
        with self._lock:
            self._latest = (snap, dict(trouble), dict(bad_for))
        self._wake.set()

    @property
    def active(self) -> bool:
        """True from the cordon to the uncordon: the taint must stay meanwhile, whatever the samples say."""
        return self.phase in RESUMABLE or self._resume is not None

    def status(self) -> dict[str, Any]:
        return {"phase": self.phase, "gpus": list(self.gpus), "slot": self.slots.held, "reason": self.reason,
                "problem": self.problem, "done": self.done, "failed": self.failed}

    # --- the loop ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._recovered:
                    self._recover()
                    self._recovered = True
                self._tick()
                self.problem = None
            except Interrupted:
                return
            except KubeError as exc:
                line = exc.line()
                if line != self.problem:
                    self.log("error", f"kubernetes: remediation of node {self.node_name}: {line}")
                self.problem = line
                self._stop.wait(self.retry_s)
            except Exception as exc:  # a bug must show in the log, not end the loop (the annotation keeps the step)
                self.log("error", f"kubernetes: remediation of node {self.node_name}: {type(exc).__name__}: {exc}")
                self._stop.wait(self.retry_s)
            self._wake.wait(1.0)
            self._wake.clear()

    def _tick(self) -> None:
        with self._lock:
            snap, trouble, bad_for = self._latest
        if self.phase == "failed":
            self._watch_failed(trouble)
            return
        if self.phase in ("rate-limited", "waiting-slot") and self.clock() < self._next_try:
            return
        if self._resume is not None:
            if self._take_slot(f"to resume the remediation of GPU {_ranges(self._resume['gpus'])}"):
                self._remediate(list(self._resume["gpus"]), self._resume)
            return
        due = sorted(g for g in trouble if bad_for.get(g, 0.0) >= self.after_s)
        if snap is None or not due:
            if self.phase in ("rate-limited", "waiting-slot"):
                self.log("info", f"kubernetes: node {self.node_name}: no GPU needs remediating any more")
            self.phase, self.reason, self._said = "idle", None, None
            return
        node = self.kube.node(self.node_name)
        last = parse_stamp(((node.get("metadata") or {}).get("annotations") or {}).get(LAST_ANNOTATION))
        if last is not None and self.wall() - last < self.interval_s:
            self.phase, self.gpus = "rate-limited", due
            self._next_try = self.clock() + self.wait_poll_s
            self._wait_said(f"GPU {_ranges(due)} needs remediating, but node {self.node_name} was remediated "
                            f"{self.wall() - last:.0f}s ago: at most one remediation per {self.interval_s:g}s "
                            "([kubernetes] remediation_interval)")
            return
        if self._take_slot(f"to remediate GPU {_ranges(due)}"):
            self._remediate(due, None)

    def _take_slot(self, what: str) -> bool:
        slot = self.slots.acquire()
        if slot is not None:
            return True
        self.phase = "waiting-slot"
        self._next_try = self.clock() + self.wait_poll_s
        self._wait_said(f"waiting for a cluster remediation slot {what}: all {self.slots.slots} "
                        f"(Leases gpuwarden-remediation-* in {self.slots.namespace}) are held by other nodes")
        return False

    def _wait_said(self, message: str) -> None:
        self.reason = message
        if self._said != message:
            self._said = message
            self.log("info", f"kubernetes: node {self.node_name}: {message}")
            self.events("RemediationWaiting", message, "Normal")

    # --- one remediation -------------------------------------------------------------------------
    def _remediate(self, gpus: list[int], resume: dict[str, Any] | None) -> None:
        state: dict[str, Any] = resume or {"gpus": gpus, "started": iso(self.wall()), "cordoned": False}
        state["slot"] = self.slots.held
        self._renewed_at = self.clock()
        self.gpus, self._said, self.reason = gpus, None, None
        self._resume = None
        t0 = self.clock()
        released = True
        try:
            self._cordon(state)  # on a resume too: the step that failed may have been the cordon itself
            self._evict(state)
            self._fix(state)
            self._finish(state, t0)
        except Failed as exc:
            self._fail(state, str(exc))
        except Interrupted:
            released = False  # stopping: the slot stays ours for the restarted agent (or runs out)
            raise
        except KubeError:
            # The API went away mid-loop: the annotation still names the step; go on from the evictions later.
            state["resumed"] = True
            self._resume, self.phase, released = state, "waiting-slot", False
            raise
        finally:
            if released and self.slots.held is not None:
                self.slots.release()

    def _journal(self, step: str, result: str, **details: Any) -> None:
        journal.write(self.state_dir, f"remediate:{step}" if step else "remediate", result, node=self.node_name,
                      gpus=self.gpus, **details)

    def _save(self, state: dict[str, Any], phase: str) -> None:
        state["phase"] = phase
        self.phase = phase
        self.kube.patch_node(self.node_name, {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state)}}})

    def _cordon(self, state: dict[str, Any]) -> None:
        state["phase"] = self.phase = "cordon"

        def change(node: Node) -> dict[str, Any]:
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            ours = not (node.get("spec") or {}).get("unschedulable") or \
                annotations.get(CORDON_ANNOTATION) == CORDON_OWNER
            state["cordoned"] = ours  # only a cordon of ours is lifted at the end
            body: dict[str, Any] = {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state)}}}
            if LAST_ANNOTATION not in annotations or "resumed" not in state:
                body["metadata"]["annotations"][LAST_ANNOTATION] = iso(self.wall())
            if ours:
                body["metadata"]["annotations"][CORDON_ANNOTATION] = CORDON_OWNER
                body["spec"] = {"unschedulable": True}
            return body
        self.kube.update_node(self.node_name, change)
        how = "cordoned it" if state["cordoned"] else "it was already unschedulable (left so at the end)"
        if state.get("resumed"):
            how += " (resumed)"
        message = (f"remediating GPU {_ranges(state['gpus'])} with cluster slot {state['slot']} "
                   f"(at most {self.slots.slots} node(s) at once): {how}")
        self.log("warning", f"kubernetes: node {self.node_name}: {message}")
        self.events("RemediationCordoned", message, "Warning")
        self._journal("cordon", "ok", slot=state["slot"], cordoned=state["cordoned"])

    def _evict(self, state: dict[str, Any]) -> None:
        self._save(state, "evict")
        snap = self._annotated()
        listed = self.kube.pods_on(self.node_name).get("items") or []
        victims, left, scope, whole = select_victims(snap, listed, state["gpus"], self.sysfs_root, self.resources)
        reach = (f"the reset of GPU {_ranges(state['gpus'])} reaches every GPU of the node (GPUs {_ranges(scope)}): "
                 "every GPU pod goes" if whole else f"the reset reaches GPU {_ranges(scope)}")
        note = f"; left running: {', '.join(left)}" if left else ""
        if not victims:
            self.events("RemediationEvicted", f"no pod to evict: {reach}{note}", "Normal")
            self._journal("evict", "ok", evicted=[], left=left)
            return
        self.events("RemediationEvicting", f"{reach}; evicting through the Eviction API (PodDisruptionBudgets "
                                           f"decide): {', '.join(f'{v.ref} ({v.why})' for v in victims)}{note}",
                    "Warning")
        deadline = self.clock() + self.eviction_timeout_s
        for v in victims:
            self._evict_one(v, deadline)
        gone = self._wait_gone(victims, deadline)
        if gone:
            raise Failed(f"pods still there {self.eviction_timeout_s:g}s after their eviction: {', '.join(gone)}")
        refs = [v.ref for v in victims]
        self.events("RemediationEvicted", f"{len(victims)} pod(s) evicted and gone: {', '.join(refs)}{note}",
                    "Normal")
        self._journal("evict", "ok", evicted=refs, left=left)

    def _evict_one(self, v: Victim, deadline: float) -> None:
        delay, told = self.backoff_s, False
        while True:
            self._keep_slot()
            try:
                self.kube.evict(v.namespace, v.name)
                return
            except NotFoundError:
                return  # gone already
            except Forbidden as exc:
                raise Failed(f"pod {v.ref}: {exc.message} ({exc.hint})") from None
            except TooManyRequests as exc:
                why = exc.message.split("): ", 1)[-1]
                if not told:
                    told = True
                    self.events("RemediationEvictionBlocked", f"pod {v.ref}: {why}; trying again with backoff for "
                                                              f"up to {self.eviction_timeout_s:g}s", "Warning")
                    self._journal("evict", "blocked", pod=v.ref, reason=why)
                if self.clock() + delay > deadline:
                    raise Failed(f"pod {v.ref}: eviction still refused after {self.eviction_timeout_s:g}s "
                                 f"([kubernetes] eviction_timeout): {why}") from None
                self._sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _wait_gone(self, victims: list[Victim], deadline: float) -> list[str]:
        left = list(victims)
        while left:
            still = []
            for v in left:
                obj = self.kube.pod(v.namespace, v.name)
                if obj is not None and (v.uid is None or (obj.get("metadata") or {}).get("uid") == v.uid):
                    still.append(v)
            left = still
            if not left or self.clock() >= deadline:
                break
            self._keep_slot()
            self._sleep(self.poll_s)
        return [v.ref for v in left]

    def _fix(self, state: dict[str, Any]) -> None:
        self._save(state, "fix")
        # Look again right before the reset: still cordoned, the slot still ours, no GPU pod arrived meanwhile.
        node = self.kube.node(self.node_name)
        if not (node.get("spec") or {}).get("unschedulable"):
            raise Failed(f"node {self.node_name} was uncordoned by someone else during the remediation: not fixing")
        if not self.slots.renew():
            raise Failed("lost the cluster remediation slot (its Lease ran out and another node took it): "
                         "not fixing")
        listed = self.kube.pods_on(self.node_name).get("items") or []
        fresh = [p for p in listed if not (p.get("metadata") or {}).get("deletionTimestamp")]
        snap = self._annotated()
        arrived, _, _, _ = select_victims(snap, fresh, state["gpus"], self.sysfs_root, self.resources)
        if arrived:
            raise Failed(f"pod(s) {', '.join(v.ref for v in arrived)} came onto the GPUs after the cordon: not fixing")
        for g in state["gpus"]:
            outcome = self.fixer(g, self._stop)
            if self._stop.is_set():
                raise Interrupted()
            self._journal("fix", "ok" if outcome.ok else "failed", gpu=g, message=outcome.message)
            if not outcome.ok:
                self.events("RemediationFixFailed", f"fix GPU {g}: {outcome.message}", "Warning")
                raise Failed(f"fix of GPU {g} failed: {outcome.message}")
            self.events("RemediationFixed", f"fix GPU {g}: {outcome.message}", "Normal")
        # The proof: a sample taken now, not what the playbook remembers.
        after = self.snapshot()
        dirty = {g: t for g, t in assess(after).items() if g in state["gpus"]}
        if dirty:
            raise Failed("verification failed: " + "; ".join(dirty[g].describe() for g in sorted(dirty)))
        self._verified = after
        message = f"GPU {_ranges(state['gpus'])} verified clean by a fresh sample: no residual VRAM, no holders"
        self._journal("verify", "ok", message=message)
        self.events("RemediationVerified", message, "Normal")

    def _finish(self, state: dict[str, Any], t0: float) -> None:
        self._save(state, "lift")
        taint = self.lift(self._verified or self.snapshot(), frozenset(state["gpus"]))

        def change(node: Node) -> dict[str, Any]:
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            body: dict[str, Any] = {"metadata": {"annotations": {STATE_ANNOTATION: None}}}
            if state.get("cordoned") and annotations.get(CORDON_ANNOTATION) == CORDON_OWNER:
                body["metadata"]["annotations"][CORDON_ANNOTATION] = None
                body["spec"] = {"unschedulable": None}
            return body
        self.kube.update_node(self.node_name, change)
        after = "uncordoned" if state.get("cordoned") else "left unschedulable as it was before"
        lifted = "taint and condition lifted" if taint is None else f"taint {taint} stays (other GPUs in trouble)"
        message = (f"GPU {_ranges(state['gpus'])} remediated and verified clean in {self.clock() - t0:.1f}s: "
                   f"node {after}, {lifted}; slot {state['slot']} released")
        self.slots.release()
        self.log("ok", f"kubernetes: node {self.node_name}: {message}")
        self._journal("", "ok", message=message)
        self.events("RemediationDone", message, "Normal")
        self.phase, self.done = "idle", self.done + 1

    def _fail(self, state: dict[str, Any], reason: str) -> None:
        reason = reason[:600]
        state.update(phase="failed", reason=reason, failed_at=iso(self.wall()))
        self._clean_since = None
        self.hold(reason)
        try:
            self.kube.patch_node(self.node_name, {"metadata": {"annotations": {STATE_ANNOTATION: json.dumps(state)}}})
        except KubeError as exc:  # the taint and condition still say it; the log says this too
            self.log("error", f"kubernetes: node {self.node_name}: could not record the failed remediation: "
                              f"{exc.message}")
        try:
            self.slots.release()  # the next node may go on: this one is held by its cordon and taint
        except KubeError as exc:
            self.log("error", f"kubernetes: node {self.node_name}: could not free the remediation slot (it runs "
                              f"out by itself): {exc.message}")
        message = (f"remediation of GPU {_ranges(state['gpus'])} failed: {reason}; node {self.node_name} stays "
                   "cordoned and tainted: fix the GPU by hand (`gpuwarden fix N`), then gpuwarden uncordons the node "
                   f"once it is clean (or remove the annotation {STATE_ANNOTATION})")
        self.log("error", f"kubernetes: {message}")
        self._journal("", "failed", reason=reason)
        self.events("RemediationFailed", message, "Warning")
        self.phase, self.reason, self.failed = "failed", reason, self.failed + 1

    def _watch_failed(self, trouble: dict[int, GpuTrouble]) -> None:
        """A failed remediation holds the node until its GPUs are clean again (a person fixed them)."""
        node = None
        if self.clock() - self._checked_at >= self.wait_poll_s:
            self._checked_at = self.clock()
            node = self.kube.node(self.node_name)
        if node is not None and STATE_ANNOTATION not in ((node.get("metadata") or {}).get("annotations") or {}):
            self.phase, self.reason = "idle", None
            self.hold(None)
            self.log("info", f"kubernetes: node {self.node_name}: the remediation annotation was removed by hand: "
                             "the hold is lifted (the cordon is left as it is)")
            return
        if trouble:
            self._clean_since = None
            return
        now = self.clock()
        if self._clean_since is None:
            self._clean_since = now
        if now - self._clean_since < self.clear_after_s:
            return
        cordoned = {"ours": False}

        def change(obj: Node) -> dict[str, Any]:
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            body: dict[str, Any] = {"metadata": {"annotations": {STATE_ANNOTATION: None}}}
            if annotations.get(CORDON_ANNOTATION) == CORDON_OWNER:
                cordoned["ours"] = True
                body["metadata"]["annotations"][CORDON_ANNOTATION] = None
                body["spec"] = {"unschedulable": None}
            return body
        self.hold(None)
        self.kube.update_node(self.node_name, change)
        message = (f"GPU {_ranges(self.gpus)} clean again for {self.clear_after_s:g}s after the failed remediation: "
                   + ("node uncordoned" if cordoned["ours"] else "hold lifted"))
        self.log("ok", f"kubernetes: node {self.node_name}: {message}")
        self._journal("", "cleared", message=message)
        self.events("RemediationCleared", message, "Normal")
        self.phase, self.reason = "idle", None

    # --- a restarted agent --------------------------------------------------------------------------
    def _recover(self) -> None:
        node = self.kube.node(self.node_name)
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(STATE_ANNOTATION)
        if not raw:
            return
        try:
            state = json.loads(raw)
            phase = state["phase"]
            state["gpus"] = [int(g) for g in state["gpus"]]
        except (ValueError, KeyError, TypeError):
            reason = f"the annotation {STATE_ANNOTATION} cannot be read: {raw[:120]!r}"
            self.phase, self.reason = "failed", reason
            self.hold(reason)
            self.log("error", f"kubernetes: node {self.node_name}: {reason}; remove it by hand once the node is "
                              "known to be fine")
            return
        self.gpus = state["gpus"]
        if phase == "failed":
            self.phase, self.reason = "failed", str(state.get("reason") or "unknown")
            self.hold(self.reason)
            self.log("warning", f"kubernetes: node {self.node_name}: a remediation of GPU {_ranges(self.gpus)} failed "
                                f"before this agent started ({self.reason}): the node stays cordoned")
            return
        if phase not in RESUMABLE:
            return
        message = (f"the agent restarted during step {phase} of the remediation of GPU {_ranges(self.gpus)} "
                   f"(started {state.get('started')}): resuming from the evictions")
        self.log("warning", f"kubernetes: node {self.node_name}: {message}")
        self.events("RemediationResumed", message, "Warning")
        self._journal("", "resumed", phase=phase)
        state["resumed"] = True
        self._resume = state

    # --- helpers ------------------------------------------------------------------------------------
    def _annotated(self) -> NodeSnapshot:
        """The latest sample as the reconciler saw it (pods named, which pod has which GPU). A resumed agent
        waits for its first one: a bare sample names no pod, and every GPU pod would look like a victim."""
        while True:
            snap = self._latest[0]
            if snap is not None:
                return snap
            self._sleep(0.1)

    def _sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise Interrupted()

    def _keep_slot(self) -> None:
        """Renew the Lease while waiting (a few times per its duration), so a long eviction keeps the slot."""
        if self.slots.held is None or self.clock() - self._renewed_at < self.slots.duration_s / 4:
            return
        self._renewed_at = self.clock()
        if not self.slots.renew():
            raise Failed("lost the cluster remediation slot while waiting (its Lease was taken): not going on")
