"""Kubernetes mode of the node agent, in one object attached to the Agent (`gpuwarden agent --kubernetes`).

annotate() runs in the sampling thread and names pods on processes and holders; on_snapshot() hands each
snapshot to a reconciler thread of its own that keeps the node condition and taint, posts Events for finished
playbooks and feeds AMD's per-GPU health service, so a slow API server never delays a sample.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Any, Callable, Protocol

from gpuwarden.ops.foundation.model import NodeSnapshot, PodGpus, SnapshotWarning
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.k8s.attribution import PodAttributor
from gpuwarden.ops.config.kubernetes import KubernetesConfig
from gpuwarden.ops.k8s.events import JournalFollower, NodeEvents
from gpuwarden.ops.k8s.health import HealthService
from gpuwarden.ops.k8s.kube import Kube, connect
from gpuwarden.ops.k8s.nodesignal import NodeSignal
from gpuwarden.ops.k8s.dra import DeviceTaints
from gpuwarden.ops.k8s.exclusion import Exclusions
from gpuwarden.ops.k8s.gate import Caller, Gate, Refused, TokenVerifier, Verdict
from gpuwarden.ops.k8s.gpucheck import check
from gpuwarden.ops.k8s.podresources import GpuAssignments
from gpuwarden.ops.services.k8s_tenantclean import Cleaner, TenantCleaner
from gpuwarden.ops.k8s.pods import PodCache
from gpuwarden.ops.services.k8s_remediation import Fixer, Remediator
from gpuwarden.ops.k8s.remediationslots import ClusterSlots
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.sampling.sampler import take_snapshot
from gpuwarden.ops.foundation import journal

Log = Callable[[str, str], None]  # (level: info|ok|warning|error, text)
# What annotate() was given besides the snapshot: the pods' GPUs, the "kubernetes" block, the pod cache version.
_Inputs = tuple[tuple[PodGpus, ...], dict[str, Any], int]


class AgentHooks(Protocol):
    """What attach() uses of the node agent (ops/agent's Agent, a module of the same layer)."""

    def add_annotator(self, annotate: Callable[[NodeSnapshot], NodeSnapshot]) -> None: ...
    def add_observer(self, observer: KubernetesNode) -> None: ...


def stderr_log(level: str, text: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {level}: {text}\n")


class KubernetesNode:
    """Owns the pod watch, the pod-resources view, the node signal and the health service of one node."""

    def __init__(self, settings: Settings, cfg: KubernetesConfig, *, kube: Kube | None = None,
                 log: Log = stderr_log, assignments: GpuAssignments | None = None,
                 pod_resources_every_s: float = 2.0, reread: Callable[[], KubernetesConfig] | None = None,
                 fixer: Fixer | None = None, remediation_tuning: dict[str, Any] | None = None,
                 post_cleaner: Cleaner | None = None, post_clean_tuning: dict[str, Any] | None = None):
        """fixer: how remediation fixes one GPU (the fix playbook, from the playbooks layer); needed when the
        [kubernetes] table says remediate = true. remediation_tuning: Remediator keyword overrides (tests).
        post_cleaner: how the agent cleans a GPU its tenant left (the purge playbook; None: check and report
        only). post_clean_tuning: TenantCleaner keyword overrides (tests)."""
        self.cfg = cfg
        self.reread = reread  # the [kubernetes] table again, with the command line's overrides (SIGHUP)
        self.node_name = cfg.resolved_node_name()
        self.log = log
        self.kube = kube or connect(cfg.kubeconfig)
        self.pods = PodCache(self.kube, self.node_name, log=log)
        self.attributor = PodAttributor(settings.proc_root, self.pods)
        self.assignments = assignments or GpuAssignments(cfg.pod_resources_socket)
        self.events = NodeEvents(self.kube, self.node_name, log=log)
        self.signal = NodeSignal(self.kube, self.node_name, policy=cfg.policy, taint_after_s=cfg.taint_after,
                                 clear_after_s=cfg.clear_after, events=self.events, log=log)
        self.journal = JournalFollower(settings.state_dir)
        self.settings = settings
        self._signal_lock = threading.Lock()  # the reconciler and the remediation's lift both drive the signal
        self._floor = 0.0  # snapshots taken before the remediation's proof are older news than it: skipped
        self.remediator: Remediator | None = None
        if cfg.remediate:
            if fixer is None:
                raise GpuwardenError("[kubernetes] remediate = true needs the agent's fix playbook",
                                     "run it through `gpuwarden agent --kubernetes`")
            self.remediator = self._remediator(settings, cfg, fixer, remediation_tuning or {})
            if cfg.policy == "off":
                log("warning", "kubernetes: remediate = true does nothing while the policy is off (no GPU is "
                               "assessed): use --k8s-policy taint")
        self.health = HealthService(cfg.health_socket, upstream=cfg.health_upstream) if cfg.health else None
        # One set of GPUs kept from new tenants, read by every per-GPU path (DeviceTaintRules, device-plugin health).
        self.exclusions = Exclusions(cfg.clear_after)
        self.device_taints = None if cfg.exclusion == "node" else DeviceTaints(
            self.kube, self.node_name, drivers=cfg.dra_drivers, effect=cfg.device_taint_effect,
            state_dir=settings.state_dir, events=self.events, log=log)
        self.cleaner: TenantCleaner | None = None
        if cfg.post_clean:
            tuning = {"snapshot": lambda: take_snapshot(settings), **(post_clean_tuning or {})}
            self.cleaner = TenantCleaner(cleaner=post_cleaner, sysfs_root=settings.sysfs_root,
                                         state_dir=settings.state_dir, grace_s=cfg.post_clean_grace,
                                         allow_reset=cfg.post_clean_reset, events=self.events, log=log,
                                         wake=self._wake_up, **tuning)
        self.pod_resources_every_s = pod_resources_every_s
        self._pod_resources_at = float("-inf")
        # (input, what else went in, output) of the last annotate
        self._annotated: tuple[NodeSnapshot, _Inputs, NodeSnapshot] | None = None
        self.last: NodeSnapshot | None = None  # the last snapshot reconciled
        self.reconciled = 0
        self._pending: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.gate: Any = None  # the gpu-check gate (ops/k8s/gate.py), when [kubernetes] gate_listen is set
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _remediator(self, settings: Settings, cfg: KubernetesConfig, fixer: Fixer,
                    tuning: dict[str, Any]) -> Remediator:
        slots = ClusterSlots(self.kube, cfg.lease_namespace, self.node_name, slots=cfg.remediation_slots,
                             duration_s=int(tuning.pop("lease_s", 600)))
        return Remediator(self.kube, self.node_name, state_dir=settings.state_dir, sysfs_root=settings.sysfs_root,
                          fixer=fixer, snapshot=lambda: take_snapshot(settings), lift=self._lift, hold=self._hold,
                          slots=slots, events=self.events, log=self.log, after_s=cfg.remediate_after,
                          interval_s=cfg.remediation_interval, eviction_timeout_s=cfg.eviction_timeout,
                          clear_after_s=cfg.clear_after, **tuning)

    def _wake_up(self) -> None:
        self._wake.set()

    def _dra(self, driver: str, pool: str, device: str) -> tuple[int, ...]:
        return self.device_taints.device_gpus(driver, pool, device) if self.device_taints else ()

    def _hold(self, reason: str | None) -> None:
        """A failed remediation holds the node (the condition and the taint say why); None lets it go."""
        self.signal.held = reason
        self._wake.set()

    def _lift(self, snap: NodeSnapshot, gpus: frozenset[int]) -> str | None:
        """The remediation verified `gpus` clean in `snap`: the signal hears it now; the taint value left (None)."""
        with self._signal_lock:
            self._floor = max(self._floor, snap.taken_at)
            self.signal.keep = False
            verified = self.journal.follow(self.events, len(snap.gpus)) | gpus
            self.signal.observe(snap, reset_needed=frozenset(self.journal.reset_needed - gpus), verified=verified)
            return self.signal.tainted

    # --- life cycle -----------------------------------------------------------------------------
    def attach(self, agent: AgentHooks) -> None:
        """Wire into an gpuwarden.ops.agent Agent before its start(): pods on every snapshot, the reconciler after it."""
        agent.add_annotator(self.annotate)
        agent.add_observer(self)

    def start(self, sync_timeout_s: float = 5.0) -> None:
        """Start the pod watch, the health service and the reconciler (a busy health socket fails here)."""
        if self.health is not None:
            self.health.start()
        if self.cfg.gate_listen:
            self.gate = Gate(self.cfg.gate_listen, TokenVerifier(self.kube, self.node_name, self.cfg.gate_audience),
                             self.judge, log=self.log)
            self.gate.start()
        self.pods.start()
        self._thread = threading.Thread(target=self._reconcile_loop, name="gpuwarden-k8s", daemon=True)
        self._thread.start()
        if self.remediator is not None:
            self.remediator.start()
        if not self.pods.wait_synced(sync_timeout_s):
            self.log("warning", f"kubernetes: the pods of node {self.node_name} are not listed yet; "
                                "processes show without pod names until they are")
        self.log("info", f"kubernetes: node {self.node_name}, policy {self.cfg.policy}, taint after "
                         f"{self.cfg.taint_after:g}s" +
                         (f", AMD device-plugin health on {self.health.socket_path}" if self.health else "") +
                         (f", remediation after {self.cfg.remediate_after:g}s (at most {self.cfg.remediation_slots} "
                          f"node(s) of the cluster at once)" if self.remediator else ""))

    def close(self) -> None:
        if self.remediator is not None:
            self.remediator.close()  # a step in progress stays in the node's annotation: the next agent resumes
        if self.cleaner is not None:
            self.cleaner.close()
        if self.gate is not None:
            self.gate.stop()
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)  # an API call in flight has its own timeout
        self.pods.stop()
        if self.health is not None:
            self.health.stop()
        self.kube.close()

    def reload(self, agent_config: object = None) -> None:
        """The agent's SIGHUP: policy, taint_after and clear_after take effect; the rest needs a restart."""
        if self.reread is None:
            return
        try:
            new = self.reread()
        except Exception as exc:  # a config that does not load leaves the running one, as the agent does
            self.log("error", f"kubernetes: reload refused, keeping the running [kubernetes] table: {exc}")
            return
        kept = [k for k in ("node_name", "pod_resources_socket", "health", "health_socket", "kubeconfig", "remediate",
                            "remediate_after", "remediation_slots", "remediation_interval", "eviction_timeout",
                            "lease_namespace")
                if getattr(new, k) != getattr(self.cfg, k)]
        if kept:
            self.log("warning", f"kubernetes: {', '.join(kept)} changed: restart the agent to apply")
        self.signal.policy, self.signal.taint_after_s, self.signal.clear_after_s = \
            new.policy, new.taint_after, new.clear_after
        self.cfg = new
        self._wake.set()  # a shorter grace may be over already

    # --- the sampling thread ----------------------------------------------------------------------
    def annotate(self, snap: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with pods named, which pod has which GPU, API troubles as warnings, the signal's state."""
        now = time.monotonic()
        if now - self._pod_resources_at >= self.pod_resources_every_s:
            self.assignments.refresh()
            self._pod_resources_at = now
        pod_gpus = self.assignments.records(snap.gpus, self._uid_of, self._dra)
        status = self.status()
        key = (pod_gpus, status, self.pods.version)
        last = self._annotated
        if last is not None and snap is last[0] and key == last[1]:
            return last[2]  # the sampler repeated its last snapshot: so do we (readers cache by identity)
        out = self.attributor.annotate(snap, pod_gpus)
        problems = [SnapshotWarning("kubernetes", f"kubernetes: {p}")
                    for p in (self.signal.problem, self.pods.problem, self.assignments.problem,
                      self.device_taints.problem if self.device_taints else None,
                      self.health.upstream_problem if self.health else None) if p]
        out = dataclasses.replace(out, warnings=out.warnings + tuple(problems), kubernetes=status)
        self._annotated = (snap, key, out)
        return out

    # --- the agent's observer protocol (ops/agent: Agent.add_observer) ----------------------------
    def on_snapshot(self, snapshot: NodeSnapshot, events: list[dict[str, Any]] | None = None) -> None:
        with self._lock:
            self._pending = snapshot
        self._wake.set()

    # --- the reconciler thread --------------------------------------------------------------------
    def reconcile(self, snap: NodeSnapshot) -> None:
        """One snapshot's worth of node signal: Events for finished playbooks, condition, taint, health."""
        with self._signal_lock:
            if snap.taken_at < self._floor:
                return  # sampled before the remediation's proof: its residual is gone already
            verified = self.journal.follow(self.events, len(snap.gpus))
            if self.remediator is not None:
                self.signal.keep = self.remediator.active
            if self.device_taints is not None and self.signal.policy != "off":
                self.device_taints.prepare(snap.gpus)
                self.signal.covered = self.device_taints.covered()
            self.signal.observe(snap, reset_needed=frozenset(self.journal.reset_needed), verified=verified)
            if self.remediator is not None:
                self.remediator.offer(snap, self.signal.trouble, self.signal.bad_for())
            excluded = self._exclude(snap, verified)
        if self.health is not None:
            self.health.update(snap, set(excluded))
        self.last = snap
        self.reconciled += 1

    def _exclude(self, snap: NodeSnapshot, verified: frozenset[int]) -> dict[int, str]:
        """The per-GPU side: post-clean of the pods that left, then the set kept from new tenants, then the
        DeviceTaintRules that say so (on DRA clusters; the node taint then leaves those GPUs to them)."""
        if self.cleaner is not None:
            gone = [(f"{a.namespace}/{a.pod}", self.assignments.gpus_of(a, snap.gpus, self._dra), at)
                    for a, at in self.assignments.gone()]
            assigned = {g for a in self.assignments.current() for g in self.assignments.gpus_of(a, snap.gpus, self._dra)}
            self.cleaner.observe(snap, gone, assigned, verified)
        # Verified by a playbook (the journal: now) or by the post-clean (the time of its verifying sample).
        proven = {g: time.time() for g in verified}
        if self.cleaner is not None:
            proven.update(self.cleaner.take_verified())
        dirty: dict[int, str] = {}
        for g, t in self.signal.trouble.items():
            dirty[g] = "reset-needed" if t.reason == "reset-needed" else ("dead-holders" if t.holders else t.reason)
        for g in snap.drained:
            dirty.setdefault(g, "drained")
        for g, why in (self.cleaner.dirty() if self.cleaner is not None else {}).items():
            dirty.setdefault(g, why)
        before = self.exclusions.excluded
        excluded = self.exclusions.update(dirty, proven, snap.taken_at)
        if self.health is not None and excluded != before:
            self._say_health(before, excluded)
        if self.device_taints is not None and self.signal.policy != "off":
            self.device_taints.reconcile(excluded, snap.gpus)
            self.signal.covered = self.device_taints.covered()
            if self.cfg.exclusion == "dra" and not self.device_taints.active and self.device_taints.problem is None:
                self.device_taints.problem = ("exclusion = \"dra\" but the cluster serves no DeviceTaintRule or no "
                                              f"ResourceSlice of {', '.join(self.cfg.dra_drivers)} names this "
                                              "node's GPUs: the node taint stands in")
        return excluded

    def _say_health(self, before: dict[int, str], now: dict[int, str]) -> None:
        """Device-plugin clusters: each GPU the health service turns unhealthy or healthy, as an Event and a
        journal line (what the device plugin will do with it: stop or resume giving it to new pods)."""
        for g in sorted(set(before) | set(now)):
            if (g in before) == (g in now):
                continue
            bad = g in now
            text = (f"GPU {g} reported unhealthy to the device plugin ({now[g]}): no new pod gets it" if bad else
                    f"GPU {g} reported healthy to the device plugin again: verified clean")
            self.log("warning" if bad else "ok", f"kubernetes: {text}")
            self.events("GPUDeviceUnhealthy" if bad else "GPUDeviceHealthy", text, "Warning" if bad else "Normal")
            journal.write(self.settings.state_dir, "device-health", "unhealthy" if bad else "healthy", gpu=g,
                          reason=now.get(g, before.get(g)), node=self.node_name)

    def process(self, snap: NodeSnapshot) -> NodeSnapshot:
        """annotate and reconcile in the caller's thread (tests and benchmarks without an agent)."""
        snap = self.annotate(snap)
        self.reconcile(snap)
        return snap

    def _reconcile_loop(self) -> None:
        while True:
            dues = [d for d in (self.signal.due_in(), self.exclusions.due_in(),
                                self.cleaner.due_in() if self.cleaner else None) if d is not None]
            due = min(dues) if dues else None
            # Woken by a snapshot, or when a taint falls due: it comes at the grace, not a sample later.
            self._wake.wait(None if due is None else due + 0.05)
            if self._stopping:
                return
            self._wake.clear()
            with self._lock:
                snap, self._pending = self._pending, None
            snap = snap or self.last
            if snap is None:
                continue
            try:
                self.reconcile(snap)
            except Exception as exc:  # a bug here must show in the log, not end the node signal
                self.log("error", f"kubernetes: reconcile failed: {type(exc).__name__}: {exc}")
                time.sleep(1.0)

    # --- the gpu-check gate (ops/k8s/gate.py) ------------------------------------------------------
    def judge(self, caller: Caller) -> Verdict:
        """Are the GPUs the kubelet gave this pod clean now? From a fresh pod-resources List and the last sample."""
        snap = self.last
        if snap is None:
            raise Refused(503, "the agent has not sampled the node yet: try again in a few seconds")
        try:
            listed = self.assignments.lister(self.assignments.socket_path)
        except GpuwardenError as exc:
            raise Refused(503, f"the agent cannot ask the kubelet which GPUs the pod has: {exc.message}") from None
        mine = [a for a in listed if (a.namespace, a.pod) == (caller.namespace, caller.pod)]
        gpus = sorted({g for a in mine for g in self.assignments.gpus_of(a, snap.gpus, self._dra)})
        if not gpus:
            return Verdict(False, (), f"the kubelet lists no GPU of node {self.node_name} for pod "
                                      f"{caller.namespace}/{caller.pod} (pod-resources API): nothing to vouch for")
        excluded = dict(self.exclusions.excluded)
        reasons = []
        for v in check(snap, gpus, frozenset(self.journal.reset_needed)):
            why = list(v.reasons) + ([f"kept from new tenants ({excluded[v.gpu]})"] if v.gpu in excluded else [])
            if why:
                reasons.append(f"GPU {v.gpu}: " + "; ".join(why))
        return Verdict(not reasons, tuple(gpus), "; ".join(reasons) or "clean")

    # --- readers ----------------------------------------------------------------------------------
    def _uid_of(self, namespace: str, name: str) -> tuple[str | None, float | None]:
        info = self.pods.by_name(namespace, name)
        return (info.uid, info.deleted_at) if info else (None, None)

    def status(self) -> dict[str, Any]:
        """The snapshot's "kubernetes" block (gpuwarden.snapshot/1): what the node says, what went wrong."""
        return {**self.signal.status(), "api_calls": self.kube.calls, "events_sent": self.events.sent,
                "pods_known": len(self.pods.all()), "pod_watch_problem": self.pods.problem,
                "pod_resources_problem": self.assignments.problem,
                "health_socket": self.health.socket_path if self.health else None,
                "health_upstream_problem": self.health.upstream_problem if self.health else None,
                "gate": {"listen": self.cfg.gate_listen, "answered": self.gate.answered} if self.gate else None,
                "remediation": self.remediator.status() if self.remediator else None,
                "excluded_gpus": {str(g): why for g, why in sorted(self.exclusions.excluded.items())},
                "device_taints": self.device_taints.status() if self.device_taints else None,
                "post_clean": self.cleaner.status() if self.cleaner else None}
