"""The `[kubernetes]` table of the node config: policy, grace before the taint, sockets, node name.

Parsed with the rest of node.toml (errors name file, line and key); the agent's flags override it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import parse_duration

# Where AMD's metrics exporter serves device health and the kubelet its pod-resources API, by default.
HEALTH_SOCKET = "/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket"
PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
POLICIES = ("taint", "condition", "off")  # how the agent tells the API server about a bad GPU

KEYS = {"policy", "taint_after", "clear_after", "node_name", "pod_resources_socket", "health", "health_socket",
        "kubeconfig", "remediate", "remediate_after", "remediation_slots", "remediation_interval", "eviction_timeout",
        "lease_namespace"}


@dataclass(frozen=True)
class KubernetesConfig:
    policy: str = "taint"  # taint | condition | off
    taint_after: float = 120.0  # seconds residual must last before the taint
    clear_after: float = 10.0  # seconds clean before the taint goes (unless a purge/reset verified it)
    node_name: str | None = None  # default: NODE_NAME, else the host name
    pod_resources_socket: str = PODRESOURCES_SOCKET
    health: bool = False  # serve AMD's per-GPU health service (opt-in)
    health_socket: str = HEALTH_SOCKET
    kubeconfig: str | None = None
    # Remediation (off by default): cordon, evict, fix (purge -> reset -> verify), uncordon (ops/services/k8s_remediation.py).
    remediate: bool = False
    remediate_after: float = 600.0  # seconds a GPU's trouble must last before the loop starts
    remediation_slots: int = 1  # nodes of the cluster remediating at once (Leases in lease_namespace)
    remediation_interval: float = 3600.0  # at most one remediation of this node per interval
    eviction_timeout: float = 300.0  # how long PodDisruptionBudget refusals and terminating pods are waited for
    lease_namespace: str = "gpuwarden"

    def resolved_node_name(self) -> str:
        return self.node_name or os.environ.get("NODE_NAME") or socket.gethostname()


def parse(raw: Any, fail: Callable[[str | None, str, str], Exception]) -> KubernetesConfig:
    """Validate the table; fail(key, problem, hint) builds the error that names the line."""
    if not isinstance(raw, dict):
        raise fail(None, "must be a table", 'write [kubernetes] with policy = "taint" under it')
    for key in raw:
        if key not in KEYS:
            raise fail(key, "unknown key", f"[kubernetes] takes {', '.join(sorted(KEYS))}")
    out: dict[str, Any] = {}
    if "policy" in raw:
        if raw["policy"] not in POLICIES:
            raise fail("policy", f"must be one of {', '.join(POLICIES)}, got {raw['policy']!r}",
                       '"taint": condition and taint; "condition": the condition only; "off": neither')
        out["policy"] = raw["policy"]
    for key in ("taint_after", "clear_after", "remediate_after", "remediation_interval", "eviction_timeout"):
        if key in raw:
            try:
                out[key] = parse_duration(raw[key])
            except GpuwardenError:
                raise fail(key, f"cannot read duration {raw[key]!r}", f'e.g. {key} = "2m" (or "90s", or 120)') from None
    for key in ("node_name", "pod_resources_socket", "health_socket", "kubeconfig", "lease_namespace"):
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                raise fail(key, "must be a non-empty string", f'e.g. {key} = "..."')
            out[key] = raw[key]
    if "health" in raw:
        if not isinstance(raw["health"], bool):
            raise fail("health", f"must be true or false, got {raw['health']!r}", "health = true serves AMD's "
                       "device-plugin health socket")
        out["health"] = raw["health"]
    if "remediate" in raw:
        if not isinstance(raw["remediate"], bool):
            raise fail("remediate", f"must be true or false, got {raw['remediate']!r}", "remediate = true lets the "
                       "agent cordon, evict, fix and uncordon the node (off by default)")
        out["remediate"] = raw["remediate"]
    if "remediation_slots" in raw:
        slots = raw["remediation_slots"]
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise fail("remediation_slots", f"must be a whole number of at least 1, got {slots!r}",
                       "remediation_slots = 1: one node of the cluster remediates at a time")
        out["remediation_slots"] = slots
    if out.get("remediate") and out.get("policy") == "off":
        raise fail("remediate", 'needs policy = "taint" or "condition": with "off" no GPU is ever found in trouble',
                   'set policy = "taint" (remediation holds a failed node with the taint), or remediate = false')
    return KubernetesConfig(**out)
