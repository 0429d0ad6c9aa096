"""Evictions for `drain --kubernetes`: which pods hold a GPU, evicting them through the Eviction API
(PodDisruptionBudgets decide: 429 means wait), and a cordon that undrain lifts only if gpuwarden set it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.k8s.attribution import PodAttributor
from gpuwarden.ops.k8s.kube import Kube, TooManyRequests
from gpuwarden.ops.k8s.objects import Node
from gpuwarden.ops.k8s.podresources import GpuAssignments
from gpuwarden.ops.k8s.pods import PodInfo, pod_info

CORDON_ANNOTATION = "gpuwarden.io/cordoned-by"
CORDON_OWNER = "gpuwarden-drain"


@dataclass(frozen=True)
class PodOnGpu:
    namespace: str
    name: str
    uid: str | None
    why: str  # "assigned by the kubelet", "runs processes on it"

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def pods_on_gpu(kube: Kube, node: str, snap: NodeSnapshot, gpu: int, *, proc_root: Path,
                pod_resources_socket: str) -> tuple[list[PodOnGpu], list[str]]:
    """Pods that hold GPU `gpu` (kubelet assignment or processes on it), and notes on what could not be read."""
    notes: list[str] = []
    listed = [p for p in (pod_info(o) for o in kube.pods_on(node).get("items") or ()) if p is not None]
    by_uid: dict[str, PodInfo] = {p.uid: p for p in listed}
    found: dict[str, PodOnGpu] = {}
    assignments = GpuAssignments(pod_resources_socket)
    assignments.refresh()
    if assignments.problem:
        notes.append(assignments.problem)
    for rec in assignments.records(snap.gpus, lambda ns, name: (None, None)):
        if gpu in rec.gpus and rec.deleted_at is None:
            uid = next((p.uid for p in listed if p.namespace == rec.namespace and p.name == rec.pod), None)
            found[f"{rec.namespace}/{rec.pod}"] = PodOnGpu(rec.namespace, rec.pod, uid, "assigned by the kubelet")
    attributor = PodAttributor(proc_root)
    for p in snap.processes:
        if not p.alive or gpu not in p.vram:
            continue
        cg = attributor.cgroup(p.pid, p.start_time)
        info = by_uid.get(cg.pod_uid) if cg else None
        if info is not None and info.ref not in found:
            found[info.ref] = PodOnGpu(info.namespace, info.name, info.uid, f"runs pid {p.pid} on it")
    return sorted(found.values(), key=lambda p: p.ref), notes


def evict(kube: Kube, pod: PodOnGpu, *, grace_s: float | None, timeout_s: float,
          progress: Callable[[str], None] = lambda m: None, sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic, retry_s: float = 2.0) -> None:
    """Evict one pod, retrying while a PodDisruptionBudget says no; TooManyRequests after `timeout_s`."""
    deadline = clock() + timeout_s
    while True:
        try:
            kube.evict(pod.namespace, pod.name, None if grace_s is None else int(grace_s))
            return
        except TooManyRequests as exc:
            if clock() >= deadline:
                raise TooManyRequests(f"pod {pod.ref}: {exc.message.split(': ', 1)[-1]} (still after {timeout_s:g}s)",
                                      "the PodDisruptionBudget allows no disruption now: scale the workload up, "
                                      "wait, or raise --eviction-timeout", status=429) from None
            progress(f"pod {pod.ref}: eviction refused by a PodDisruptionBudget; trying again")
            sleep(retry_s)


def wait_gone(kube: Kube, pods: list[PodOnGpu], timeout_s: float, *, poll_s: float = 0.5,
              sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Poll until each pod is gone (or replaced by a new one of the same name); the refs still there."""
    deadline = clock() + timeout_s
    left = list(pods)
    while left:
        still = []
        for p in left:
            obj = kube.pod(p.namespace, p.name)
            if obj is not None and (p.uid is None or (obj.get("metadata") or {}).get("uid") == p.uid):
                still.append(p)
        left = still
        if not left or clock() >= deadline:
            break
        sleep(poll_s)
    return [p.ref for p in left]


def cordon(kube: Kube, node: str) -> bool:
    """Mark the node unschedulable; True when gpuwarden did it (False: it already was, left as it was)."""
    def change(obj: Node) -> Node | None:
        if (obj.get("spec") or {}).get("unschedulable"):
            return None
        return {"metadata": {"annotations": {CORDON_ANNOTATION: CORDON_OWNER}}, "spec": {"unschedulable": True}}
    return kube.update_node(node, change) is not None


def uncordon_if_ours(kube: Kube, node: str) -> str:
    """Lift the cordon only when gpuwarden's drain set it; says what it did."""
    def change(obj: Node) -> Node | None:
        if ((obj.get("metadata") or {}).get("annotations") or {}).get(CORDON_ANNOTATION) != CORDON_OWNER:
            return None
        body: Node = {"metadata": {"annotations": {CORDON_ANNOTATION: None}}}
        if (obj.get("spec") or {}).get("unschedulable"):
            body["spec"] = {"unschedulable": None}
        return body
    if kube.update_node(node, change) is None:
        return f"node {node} was not cordoned by gpuwarden: left as it is"
    return f"node {node} uncordoned (gpuwarden had cordoned it)"
