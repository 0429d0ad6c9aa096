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
from typing import Any, Callable

from ..model import NodeSnapshot, SnapshotWarning
from ..settings import Settings
from .attribution import PodAttributor
from ..config.kubernetes import KubernetesConfig
from .events import JournalFollower, NodeEvents
from .health import HealthService
from .kube import Kube, connect
from .nodesignal import NodeSignal
from .podresources import GpuAssignments
from .pods import PodCache

Log = Callable[[str, str], None]  # (level: info|ok|warning|error, text)


def stderr_log(level: str, text: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {level}: {text}\n")


class KubernetesNode:
    """Owns the pod watch, the pod-resources view, the node signal and the health service of one node."""

    def __init__(self, settings: Settings, cfg: KubernetesConfig, *, kube: Kube | None = None,
                 log: Log = stderr_log, assignments: GpuAssignments | None = None,
                 pod_resources_every_s: float = 2.0, reread: Callable[[], KubernetesConfig] | None = None):
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
        self.health = HealthService(cfg.health_socket) if cfg.health else None
        self.pod_resources_every_s = pod_resources_every_s
        self._pod_resources_at = float("-inf")
        self._annotated: tuple = (None, None, None)  # (input, what else went in, output) of the last annotate
        self.last: NodeSnapshot | None = None  # the last snapshot reconciled
        self.reconciled = 0
        self._pending: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # --- life cycle -----------------------------------------------------------------------------
    def attach(self, agent) -> None:
        """Wire into an gpuwarden.ops.agent Agent before its start(): pods on every snapshot, the reconciler after it."""
        agent.add_annotator(self.annotate)
        agent.add_observer(self)

    def start(self, sync_timeout_s: float = 5.0) -> None:
        """Start the pod watch, the health service and the reconciler (a busy health socket fails here)."""
        if self.health is not None:
            self.health.start()
        self.pods.start()
        self._thread = threading.Thread(target=self._reconcile_loop, name="gpuwarden-k8s", daemon=True)
        self._thread.start()
        if not self.pods.wait_synced(sync_timeout_s):
            self.log("warning", f"kubernetes: the pods of node {self.node_name} are not listed yet; "
                                "processes show without pod names until they are")
        self.log("info", f"kubernetes: node {self.node_name}, policy {self.cfg.policy}, taint after "
                         f"{self.cfg.taint_after:g}s" +
                         (f", AMD device-plugin health on {self.health.socket_path}" if self.health else ""))

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)  # an API call in flight has its own timeout
        self.pods.stop()
        if self.health is not None:
            self.health.stop()
        self.kube.close()

    def reload(self, agent_config=None) -> None:
        """The agent's SIGHUP: policy, taint_after and clear_after take effect; the rest needs a restart."""
        if self.reread is None:
            return
        try:
            new = self.reread()
        except Exception as exc:  # a config that does not load leaves the running one, as the agent does
            self.log("error", f"kubernetes: reload refused, keeping the running [kubernetes] table: {exc}")
            return
        kept = [k for k in ("node_name", "pod_resources_socket", "health", "health_socket", "kubeconfig")
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
        pod_gpus = self.assignments.records(snap.gpus, self._uid_of)
        status = self.status()
        key = (pod_gpus, status, self.pods.version)
        if snap is self._annotated[0] and key == self._annotated[1]:
            return self._annotated[2]  # the sampler repeated its last snapshot: so do we (readers cache by identity)
        out = self.attributor.annotate(snap, pod_gpus)
        problems = [SnapshotWarning("kubernetes", f"kubernetes: {p}")
                    for p in (self.signal.problem, self.pods.problem, self.assignments.problem) if p]
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
        verified = self.journal.follow(self.events, len(snap.gpus))
        self.signal.observe(snap, reset_needed=frozenset(self.journal.reset_needed), verified=verified)
        if self.health is not None:
            self.health.update(snap, set(self.signal.trouble))
        self.last = snap
        self.reconciled += 1

    def process(self, snap: NodeSnapshot) -> NodeSnapshot:
        """annotate and reconcile in the caller's thread (tests and benchmarks without an agent)."""
        snap = self.annotate(snap)
        self.reconcile(snap)
        return snap

    def _reconcile_loop(self) -> None:
        while True:
            due = self.signal.due_in()
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

    # --- readers ----------------------------------------------------------------------------------
    def _uid_of(self, namespace: str, name: str) -> tuple[str | None, float | None]:
        info = self.pods.by_name(namespace, name)
        return (info.uid, info.deleted_at) if info else (None, None)

    def status(self) -> dict[str, Any]:
        """The snapshot's "kubernetes" block (gpuwarden.snapshot/1): what the node says, what went wrong."""
        return {**self.signal.status(), "api_calls": self.kube.calls, "events_sent": self.events.sent,
                "pods_known": len(self.pods.all()), "pod_watch_problem": self.pods.problem,
                "pod_resources_problem": self.assignments.problem,
                "health_socket": self.health.socket_path if self.health else None}
