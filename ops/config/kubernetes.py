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
        "lease_namespace", "exclusion", "dra_drivers", "device_taint_effect", "post_clean", "post_clean_grace",
        "post_clean_reset", "gate_listen", "gate_audience", "health_upstream"}
EXCLUSIONS = ("auto", "dra", "node")  # how one dirty GPU is kept from new tenants
DEVICE_TAINT_EFFECTS = ("NoSchedule", "NoExecute")


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
    # Per-GPU exclusion (ops/k8s/dra.py): "auto" uses DeviceTaintRules where the cluster serves them and the
    # node's ResourceSlices name its GPUs, else the node taint; "dra" insists (a problem is reported); "node": taint.
    exclusion: str = "auto"
    dra_drivers: tuple[str, ...] = ("gpu.amd.com", "gpu.nvidia.com")
    device_taint_effect: str = "NoSchedule"  # NoExecute (opt-in) also evicts the pods that hold the device
    # Post-clean by the agent (ops/services/k8s_tenantclean.py): a pod that held GPUs left -> check, clean, verify.
    post_clean: bool = True
    post_clean_grace: float = 5.0
    post_clean_reset: bool = False  # a reset only where every GPU it reaches is free
    # The unprivileged gpu-check init container asks the agent here (ops/k8s/gate.py); "" serves nothing.
    gate_listen: str = ""
    gate_audience: str = "gpuwarden"
    # Device-plugin clusters: AMD's metrics exporter's own socket; the health service merges its verdict.
    health_upstream: str | None = None

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
    for key in ("node_name", "pod_resources_socket", "health_socket", "kubeconfig", "lease_namespace",
                "gate_audience", "health_upstream"):
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                raise fail(key, "must be a non-empty string", f'e.g. {key} = "..."')
            out[key] = raw[key]
    if "health" in raw:
        if not isinstance(raw["health"], bool):
            raise fail("health", f"must be true or false, got {raw['health']!r}", "health = true serves AMD's "
                       "device-plugin health socket")
        out["health"] = raw["health"]
    if "gate_listen" in raw:
        if not isinstance(raw["gate_listen"], str):
            raise fail("gate_listen", "must be a string", 'e.g. gate_listen = "0.0.0.0:9836" ("" serves nothing)')
        out["gate_listen"] = raw["gate_listen"]
    for key, choices in (("exclusion", EXCLUSIONS), ("device_taint_effect", DEVICE_TAINT_EFFECTS)):
        if key in raw:
            if raw[key] not in choices:
                raise fail(key, f"must be one of {', '.join(choices)}, got {raw[key]!r}", f'e.g. {key} = "{choices[0]}"')
            out[key] = raw[key]
    if "dra_drivers" in raw:
        drivers = raw["dra_drivers"]
        if not isinstance(drivers, list) or not all(isinstance(d, str) and d for d in drivers):
            raise fail("dra_drivers", "must be a list of driver names", 'e.g. dra_drivers = ["gpu.amd.com"]')
        out["dra_drivers"] = tuple(drivers)
    if "post_clean_grace" in raw:
        try:
            out["post_clean_grace"] = parse_duration(raw["post_clean_grace"])
        except GpuwardenError:
            raise fail("post_clean_grace", f"cannot read duration {raw['post_clean_grace']!r}",
                       'e.g. post_clean_grace = "5s"') from None
    for key in ("post_clean", "post_clean_reset"):
        if key in raw:
            if not isinstance(raw[key], bool):
                raise fail(key, f"must be true or false, got {raw[key]!r}", f"{key} = true or false")
            out[key] = raw[key]
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
