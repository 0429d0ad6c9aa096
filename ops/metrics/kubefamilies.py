"""The Kubernetes-mode families (`gpuwarden agent --kubernetes`): which pods are behind a GPU's residual, and
what the agent last told the API server (condition, taint, trouble reaching it). Absent outside that mode.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.metrics.reading import MetricsOptions

P = "gpuwarden_"


def kubernetes_families(snap: NodeSnapshot, gpu_labels: dict[int, tuple[str, ...]], label_names: tuple[str, ...],
                        options: MetricsOptions) -> Iterator[Metric]:
    """gpu_labels: each GPU's label values (GPU_LABELS order); label_names: those names."""
    host = (options.hostname,) if options.hostname else ()
    host_name = ("hostname",) if options.hostname else ()
    pods = GaugeMetricFamily(
        P + "gpu_residual_pod_info", "Pods behind a GPU's residual VRAM (Kubernetes mode): role holder, a process of "
        "the pod keeps it; role last-tenant, the deleted pod the kubelet last gave the GPU to (an ownerless leak).",
        labels=[*label_names, "namespace", "pod", "container", "role", *host_name])
    seen = set()
    for r in snap.residual:
        ident = gpu_labels.get(r.gpu_index)
        if ident is None:
            continue
        rows = [(h.namespace or "", h.pod, h.container_name or "", "holder") for h in r.holders if h.pod]
        if r.significant and not r.holders:
            rows += [(p.namespace, p.pod, p.container_name, "last-tenant") for p in snap.pods
                     if p.deleted_at is not None and r.gpu_index in p.gpus]
        for row in rows:
            if (r.gpu_index, row) not in seen:  # one series per pod and role, however many of its processes
                seen.add((r.gpu_index, row))
                pods.add_metric([*ident, *row, *host], 1)
    yield pods
    k8s = snap.kubernetes
    if k8s is None:
        return
    condition = (k8s.get("condition") or {}).get("status")
    for name, doc, value in (
        ("kubernetes_node_condition", "1 while the node condition GPUResidualVRAM is True as gpuwarden last "
         "wrote it.", condition == "True"),
        ("kubernetes_node_tainted", "1 while gpuwarden's taint gpuwarden.io/gpu-unhealthy is on the node.",
         k8s.get("taint") is not None),
        ("kubernetes_api_problem", "1 while the last call to the API server failed (RBAC refusal, outage): the "
         "condition and the taint may be out of date; the agent's status says why.", k8s.get("problem") is not None),
    ) + _remediation(k8s.get("remediation")):
        fam = GaugeMetricFamily(P + name, doc, labels=list(host_name))
        fam.add_metric(list(host), 1 if value else 0)
        yield fam


def _remediation(state: dict[str, object] | None) -> tuple[tuple[str, str, bool], ...]:
    """The remediation loop's gauges, only when [kubernetes] remediate is on."""
    if not state:
        return ()
    phase = state.get("phase")
    return (("kubernetes_remediating", "1 while gpuwarden's remediation holds the node (cordoned, evicting, fixing, "
             "verifying).", phase in ("cordon", "evict", "fix", "lift")),
            ("kubernetes_remediation_failed", "1 while a failed remediation keeps the node cordoned and tainted "
             "(the condition and the node's gpuwarden.io/remediation annotation say why).", phase == "failed"))
