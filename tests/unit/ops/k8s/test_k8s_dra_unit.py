"""The unit half of tests/integration/ops/k8s/test_k8s_dra.py (its tests that need no process, socket or server); the pair's subject:
Per-GPU exclusion on DRA clusters and the agent's post-clean, against the API-server stand-in (ResourceSlices,
DeviceTaintRules, discovery, RBAC) and the kubelet's pod-resources stand-in, through the official client."""

from __future__ import annotations


import pytest

from helpers.k8s import NODE, Clock, GiB, api, cluster_role_rules, snapshot  # noqa: F401  (api is a fixture)
from gpuwarden.ops.k8s.dra import TAINT_KEY, map_devices, rule_name
from helpers.k8s_dra import rig  # noqa: F401  (fixtures and marks: pytest finds them by name)
from helpers.k8s_dra import AMD, amd_devices


# --- mapping and discovery -------------------------------------------------------------------------------------
def test_devices_map_to_gpus_by_pci_bus_id_or_uuid_and_partitions_to_their_gpu():
    snap = snapshot(gpus=4)
    amd = {"spec": {"driver": AMD, "pool": {"name": NODE}, "devices": amd_devices(2, {1: 2})}}
    nvidia = {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": NODE}, "devices": [
        # NVIDIA/k8s-dra-driver-gpu GetDevice: gpu-<minor>, uuid and pcieBusID (no domain in some versions)
        {"name": "gpu-2", "attributes": {"uuid": {"string": "UUID-2"}, "pcieBusID": {"string": "12:00.0"}}},
        {"name": "gpu-3", "attributes": {"gpu.nvidia.com/uuid": {"string": "uuid-3"}}},
        {"name": "gpu-9", "attributes": {"uuid": {"string": "GPU-elsewhere"}}}]}}
    found, unmatched = map_devices([amd, nvidia], snap.gpus)
    assert [(d.driver, d.name, d.gpus) for d in found] == [
        (AMD, "gpu-0-128", (0,)), (AMD, "gpu-1-129", (1,)), (AMD, "gpu-1-201", (1,)),
        ("gpu.nvidia.com", "gpu-2", (2,)), ("gpu.nvidia.com", "gpu-3", (3,))]
    assert unmatched == [f"gpu.nvidia.com/{NODE}/gpu-9"]
    names = {rule_name(NODE, d) for d in found}
    assert len(names) == len(found) and all(len(n) <= 253 and n == n.lower() for n in names)


def test_a_sample_older_than_the_verification_does_not_hold_the_gpu_back():
    """The post-clean verifies GPU 2 with a fresh sample at t=100; the reconciler then still holds the agent's
    sample of t=99 (the residual the clean removed): it must not keep the GPU excluded for clear_after_s."""
    from gpuwarden.ops.k8s.exclusion import Exclusions
    clock = Clock()
    ex = Exclusions(clear_after_s=10.0, clock=clock)
    assert ex.update({2: "residual-vram"}, taken_at=98.0) == {2: "residual-vram"}
    assert ex.update({2: "residual-vram"}, {2: 100.0}, taken_at=99.0) == {}
    assert ex.update({}, taken_at=101.0) == {}
    assert ex.update({2: "residual-vram"}, taken_at=102.0) == {2: "residual-vram"}  # new news: dirty again
    assert ex.update({}, taken_at=103.0) == {2: "residual-vram"}  # not verified: clean for clear_after_s first
    clock.advance(10)
    assert ex.update({}, taken_at=113.0) == {}


def test_a_misspelt_rule_field_fails_validation():
    import kubernetes_validate
    bad = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "x"},
           "spec": {"deviceSelector": {"driver": AMD, "devce": "gpu-0-128"},
                    "taint": {"key": TAINT_KEY, "effect": "NoSchedule"}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.36.0", strict=True)


def test_the_new_keys_of_the_kubernetes_table_are_checked():
    from gpuwarden.ops.config.kubernetes import parse

    def fail(key, problem, hint):
        return ValueError(f"{key}: {problem} ({hint})")
    cfg = parse({"exclusion": "dra", "dra_drivers": ["gpu.amd.com"], "device_taint_effect": "NoExecute",
                 "post_clean": False, "post_clean_grace": "30s", "post_clean_reset": True,
                 "gate_listen": "0.0.0.0:9836", "gate_audience": "gw", "health_upstream": "/run/up.sock"}, fail)
    assert (cfg.exclusion, cfg.dra_drivers, cfg.device_taint_effect, cfg.post_clean, cfg.post_clean_grace,
            cfg.post_clean_reset, cfg.gate_listen, cfg.gate_audience, cfg.health_upstream) == \
        ("dra", ("gpu.amd.com",), "NoExecute", False, 30.0, True, "0.0.0.0:9836", "gw", "/run/up.sock")
    defaults = parse({}, fail)
    assert (defaults.exclusion, defaults.device_taint_effect, defaults.post_clean, defaults.post_clean_reset,
            defaults.gate_listen) == ("auto", "NoSchedule", True, False, "")
    for bad, key in (({"exclusion": "pods"}, "exclusion"), ({"device_taint_effect": "PreferNoSchedule"},
                                                              "device_taint_effect"),
                     ({"dra_drivers": "gpu.amd.com"}, "dra_drivers"), ({"post_clean_grace": "soon"}, "post_clean_grace"),
                     ({"post_clean_reset": "yes"}, "post_clean_reset"), ({"gate_listen": 9836}, "gate_listen")):
        with pytest.raises(ValueError, match=f"^{key}: "):
            parse(bad, fail)
