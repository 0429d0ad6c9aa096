"""Drain with evictions: the pods holding the GPU leave through the Eviction API (PodDisruptionBudgets
respected), the node is cordoned so their replacements land elsewhere, then the usual drain runs.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.node import nodestate
from gpuwarden.ops.k8s.evict import pods_on_gpu, cordon, evict, wait_gone, uncordon_if_ours
from gpuwarden.ops.k8s.kube import KubeError
from gpuwarden.ops.sampling.sampler import take_snapshot

from gpuwarden.playbooks.drain import DrainPlaybook, UndrainPlaybook
from gpuwarden.playbooks.framework import RunContext, SkipStep, Step, StepFailed


class KubernetesDrainPlaybook(DrainPlaybook):
    name = "drain"

    def __init__(self, gpu: int, *, node_name: str, kube_factory, cordon: bool = True,
                 eviction_timeout_s: float = 120.0, pod_resources_socket: str, **kw: Any):
        super().__init__(gpu, **kw)
        self.node_name = node_name
        self.kube_factory = kube_factory
        self.cordon = cordon
        self.eviction_timeout_s = eviction_timeout_s
        self.pod_resources_socket = pod_resources_socket
        self.description = (f"drain GPU {gpu} on Kubernetes node {node_name}: evict its pods, "
                            + ("cordon the node, " if cordon else "") + "mark it drained, stop its engines, "
                            "wait until it is idle")
        self._kube = None

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "kubernetes": self.node_name, "cordon": self.cordon}

    def kube(self):
        if self._kube is None:
            self._kube = self.kube_factory()
        return self._kube

    def preconditions(self, ctx: RunContext) -> list[str]:
        problems = super().preconditions(ctx)
        # Only the processes the driver charges matter here: no need for another deep scan of every fd.
        snap = take_snapshot(ctx.settings, deep=False)
        pods, notes = pods_on_gpu(self.kube(), self.node_name, snap, self.gpu, proc_root=ctx.settings.proc_root,
                                  pod_resources_socket=self.pod_resources_socket)
        ctx.scratch["pods_planned"] = pods
        for n in notes:
            ctx.info(f"note: {n}")
        return problems

    def plan(self, ctx: RunContext) -> list[Step]:
        pods = ctx.scratch.get("pods_planned", [])
        steps = []
        if self.cordon:
            steps.append(Step("cordon", f"cordon node {self.node_name} so evicted pods are not placed back on it",
                              self._cordon, destructive=True))
        what = ", ".join(f"{p.ref} ({p.why})" for p in pods) or "none hold it now"
        steps.append(Step("evict", f"evict the pods on GPU {self.gpu} through the Eviction API "
                                   f"(PodDisruptionBudgets respected): {what}", self._evict, destructive=True))
        return steps + super().plan(ctx)

    def _cordon(self, ctx: RunContext) -> str:
        if cordon(self.kube(), self.node_name):
            return f"node {self.node_name} cordoned (undrain lifts it)"
        raise SkipStep(f"node {self.node_name} was already unschedulable: left as it is (undrain will not lift it)")

    def _evict(self, ctx: RunContext) -> str:
        pods = ctx.scratch.get("pods_planned", [])
        if not pods:
            raise SkipStep(f"no pod holds GPU {self.gpu}")
        for p in pods:
            try:
                evict(self.kube(), p, grace_s=self.grace_s, timeout_s=self.eviction_timeout_s,
                      progress=lambda m: ctx.info(m))
            except KubeError as exc:
                raise StepFailed(exc.message, exc.hint) from None
            ctx.info(f"pod {p.ref}: eviction accepted", pod=p.ref)
        left = wait_gone(self.kube(), pods, self.timeout_s)
        if left:
            raise StepFailed(f"pods still terminating after {self.timeout_s:g}s: {', '.join(left)}",
                             "they may have long termination grace periods; drain again later")
        return f"{len(pods)} pod(s) evicted: " + ", ".join(p.ref for p in pods)


class KubernetesUndrainPlaybook(UndrainPlaybook):
    name = "undrain"

    def __init__(self, gpu: int, *, node_name: str, kube_factory):
        super().__init__(gpu)
        self.node_name = node_name
        self.kube_factory = kube_factory
        self.description = f"undrain GPU {gpu}: launch may use it again; uncordon node {node_name} if gpuwarden cordoned it"

    def plan(self, ctx: RunContext) -> list[Step]:
        return super().plan(ctx) + [Step("uncordon", f"uncordon node {self.node_name} if gpuwarden's drain cordoned "
                                                     "it and no other GPU is drained", self._uncordon, destructive=True)]

    def _uncordon(self, ctx: RunContext) -> str:
        others = sorted(g for g in nodestate.drained(ctx.settings.state_dir) if g != self.gpu)
        if others:
            raise SkipStep(f"GPU(s) {', '.join(map(str, others))} still drained: the node stays cordoned")
        result = uncordon_if_ours(self.kube_factory(), self.node_name)
        if "left as it is" in result:
            raise SkipStep(result)
        return result
