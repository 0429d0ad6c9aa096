"""The `[kubernetes]` table of the node config: policy, grace before the taint, sockets, node name.

Parsed with the rest of node.toml (errors name file, line and key); the agent's flags override it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable

from gpuwarden.ops.config import keys, schema

_K = keys.section("kubernetes")
# Where AMD's metrics exporter serves device health and the kubelet its pod-resources API, by default.
HEALTH_SOCKET: str = _K["health_socket"].default
PODRESOURCES_SOCKET: str = _K["pod_resources_socket"].default
POLICIES = _K["policy"].choices  # how the agent tells the API server about a bad GPU
KEYS = set(_K)
EXCLUSIONS = _K["exclusion"].choices  # how one dirty GPU is kept from new tenants
DEVICE_TAINT_EFFECTS = _K["device_taint_effect"].choices


def _d(name: str) -> Any:
    return _K[name].default


@dataclass(frozen=True)
class KubernetesConfig:
    policy: str = _d("policy")  # taint | condition | off
    taint_after: float = _d("taint_after")  # seconds residual must last before the taint
    clear_after: float = _d("clear_after")  # seconds clean before the taint goes (unless a purge/reset verified it)
    node_name: str | None = _d("node_name")  # default: NODE_NAME, else the host name
    pod_resources_socket: str = PODRESOURCES_SOCKET
    health: bool = _d("health")  # serve AMD's per-GPU health service (opt-in)
    health_socket: str = HEALTH_SOCKET
    kubeconfig: str | None = _d("kubeconfig")
    # Remediation (off by default): cordon, evict, fix (purge -> reset -> verify), uncordon (ops/services/k8s_remediation.py).
    remediate: bool = _d("remediate")
    remediate_after: float = _d("remediate_after")  # seconds a GPU's trouble must last before the loop starts
    remediation_slots: int = _d("remediation_slots")  # nodes of the cluster remediating at once (Leases)
    remediation_interval: float = _d("remediation_interval")  # at most one remediation of this node per interval
    eviction_timeout: float = _d("eviction_timeout")  # how long PDB refusals and terminating pods are waited for
    lease_namespace: str = _d("lease_namespace")
    # Per-GPU exclusion (ops/k8s/dra.py): "auto" uses DeviceTaintRules where the cluster serves them and the
    # node's ResourceSlices name its GPUs, else the node taint; "dra" insists (a problem is reported); "node": taint.
    exclusion: str = _d("exclusion")
    dra_drivers: tuple[str, ...] = _d("dra_drivers")
    device_taint_effect: str = _d("device_taint_effect")  # NoExecute (opt-in) also evicts the pods holding the device
    # Post-clean by the agent (ops/services/k8s_tenantclean.py): a pod that held GPUs left -> check, clean, verify.
    post_clean: bool = _d("post_clean")
    post_clean_grace: float = _d("post_clean_grace")
    post_clean_reset: bool = _d("post_clean_reset")  # a reset only where every GPU it reaches is free
    # The unprivileged gpu-check init container asks the agent here (ops/k8s/gate.py); "" serves nothing.
    gate_listen: str = _d("gate_listen")
    gate_audience: str = _d("gate_audience")
    # Device-plugin clusters: AMD's metrics exporter's own socket; the health service merges its verdict.
    health_upstream: str | None = _d("health_upstream")

    def resolved_node_name(self) -> str:
        return self.node_name or os.environ.get("NODE_NAME") or socket.gethostname()


def parse(raw: Any, fail: Callable[[str | None, str, str], Exception],
          report: Callable[[Any], None] | None = None) -> KubernetesConfig:
    """Validate the table; fail(key, problem, hint) builds the error that names the line.

    Without `report` the first error is raised; with it each is reported and the valid keys are kept."""
    if not isinstance(raw, dict):
        raise fail(None, "must be a table", 'write [kubernetes] with policy = "taint" under it')
    values, problems = schema.check_table(raw, _K, "[kubernetes]")
    errors = [fail(key, problem, hint) for key, _sub, problem, hint in problems]
    if values.get("remediate") and values.get("policy") == "off":
        errors.append(fail("remediate", 'needs policy = "taint" or "condition": with "off" no GPU is ever found '
                           'in trouble', 'set policy = "taint" (remediation holds a failed node with the taint), '
                           'or remediate = false'))
    if errors and report is None:
        raise errors[0]
    for exc in errors:
        report(exc)  # type: ignore[misc]
    return KubernetesConfig(**values)
