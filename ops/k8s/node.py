"""Kubernetes mode of the agent, in one object: process(snapshot) once per sample does it all.

It names pods on the snapshot's processes and holders, records which pod has which GPU, keeps the node's
condition and taint, posts Events for finished playbooks, and feeds AMD's per-GPU health service.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from ..model import NodeSnapshot
from ..settings import Settings
from .attribution import PodAttributor
from .config import KubernetesConfig
from .events import JournalFollower, NodeEvents
from .health import HealthService
from .kube import Kube, connect
from .nodesignal import NodeSignal
from .podresources import GpuAssignments
from .pods import PodCache


class KubernetesNode:
    """Owns the pod watch, the pod-resources view, the node signal and the health service of one node."""

    def __init__(self, settings: Settings, cfg: KubernetesConfig, *, kube: Kube | None = None,
                 log: Callable[[str], None] = print, assignments: GpuAssignments | None = None,
                 pod_resources_every_s: float = 2.0):
        self.cfg = cfg
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
        self.last: NodeSnapshot | None = None

    def start(self, sync_timeout_s: float = 5.0) -> None:
        self.pods.start()
        if self.health is not None:
            self.health.start()
        if not self.pods.wait_synced(sync_timeout_s):
            self.log(f"kubernetes: the pods of node {self.node_name} are not listed yet; "
                     "processes show without pod names until they are")

    def close(self) -> None:
        self.pods.stop()
        if self.health is not None:
            self.health.stop()
        self.kube.close()

    def process(self, snap: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with pods named; the node's condition, taint, events and health brought up to date."""
        now = time.monotonic()
        if now - self._pod_resources_at >= self.pod_resources_every_s:
            self.assignments.refresh()
            self._pod_resources_at = now
        snap = self.attributor.annotate(snap, self.assignments.records(snap.gpus, self._uid_of))
        verified = self.journal.follow(self.events, len(snap.gpus))
        self.signal.observe(snap, reset_needed=frozenset(self.journal.reset_needed), verified=verified)
        if self.health is not None:
            self.health.update(snap, set(self.signal.trouble))
        problems = [f"kubernetes: {p}" for p in (self.signal.problem, self.pods.problem, self.assignments.problem) if p]
        if problems:
            snap = dataclasses.replace(snap, warnings=snap.warnings + tuple(problems))
        return snap

    # The node agent's observer protocol (ops/agent: Agent.add_observer): called after each of its samples.
    def on_snapshot(self, snapshot: NodeSnapshot, events: list | None = None) -> None:
        self.last = self.process(snapshot)

    def wake_in(self) -> float | None:
        """When the next sample should come at the latest (a taint falling due), in seconds; None: no hurry."""
        return self.signal.due_in()

    def _uid_of(self, namespace: str, name: str) -> tuple[str | None, float | None]:
        info = self.pods.by_name(namespace, name)
        return (info.uid, info.deleted_at) if info else (None, None)

    def status(self) -> dict:
        return {**self.signal.status(), "api_calls": self.kube.calls, "events_sent": self.events.sent,
                "pods_known": len(self.pods.all()), "pod_watch_problem": self.pods.problem,
                "pod_resources_problem": self.assignments.problem,
                "health_socket": self.health.socket_path if self.health else None}
