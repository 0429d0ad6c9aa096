"""Per-GPU exclusion on DRA clusters and the agent's post-clean, against the API-server stand-in (ResourceSlices,
DeviceTaintRules, discovery, RBAC) and the kubelet's pod-resources stand-in, through the official client."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from helpers.journal import read_journal
from helpers.k8s import NODE, Clock, GiB, api, cluster_role_rules, snapshot  # noqa: F401  (api is a fixture)
from gpuwarden.ops.k8s.dra import TAINT_KEY, DeviceTaints, discover
from gpuwarden.ops.k8s.nodesignal import TAINT_KEY as NODE_TAINT
from gpuwarden.ops.services.k8s_remediation import FixOutcome
from gpuwarden.ops.foundation.model import Holder
from helpers.k8s_dra import rig  # noqa: F401  (fixtures and marks: pytest finds them by name)
from helpers.k8s_dra import AMD, amd_devices


def non_writes(api, since=0.0):
    return [r for r in api.calls(since) if r.method not in ("GET",)]


@pytest.mark.parametrize("served, expected", [
    ({"v1": {"resourceslices", "devicetaintrules"}}, ("v1", "v1")),
    ({"v1": {"resourceslices"}, "v1beta2": {"resourceslices", "devicetaintrules"}}, ("v1", "v1beta2")),
    ({"v1beta2": {"resourceslices", "devicetaintrules"}}, ("v1beta2", "v1beta2")),
    ({"v1beta1": {"resourceslices"}}, (None, None)),  # devices[].basic: a shape gpuwarden does not read
    ({}, (None, None)),
])
def test_each_resource_is_found_in_the_newest_version_discovery_lists(api, served, expected):
    api.dra_versions = served
    assert discover(api.kube()) == expected


def rules_by_device(api) -> dict[str, dict]:
    return {r["spec"]["deviceSelector"]["device"]: r for r in api.rules()}


def test_a_tenant_that_leaves_gets_its_gpus_device_tainted_then_lifted_once_checked_clean(api, rig):
    api.allowed = cluster_role_rules()  # the shipped ClusterRole is all the agent may use
    api.add_resource_slice(NODE, AMD, amd_devices())
    api.add_resource_slice("other-node", AMD, amd_devices())  # another node's devices: never selected
    r = rig()
    r.kubelet.assign_claim("team-a", "trainer-0", "main", "gpus", AMD, NODE, "gpu-2-130")
    r.sample()
    assert api.rules() == [] and r.node.device_taints.active
    snap = r.sample()
    assert [p.gpus for p in snap.pods if p.pod == "trainer-0"] == [(2,)]  # the claim's device is GPU 2

    quiet = time.time()
    for _ in range(5):
        r.sample()
    assert non_writes(api, quiet) == []  # nothing changes: nothing written

    r.kubelet.remove_pod("team-a", "trainer-0")
    r.sample()
    (rule,) = api.rules()
    assert rule["apiVersion"] == "resource.k8s.io/v1beta2"  # the version discovery found serving the rules
    assert rule["spec"]["deviceSelector"] == {"driver": AMD, "pool": NODE, "device": "gpu-2-130"}
    assert rule["spec"]["taint"]["key"] == TAINT_KEY and rule["spec"]["taint"]["value"] == "tenant-left"
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert rule["metadata"]["labels"]["gpuwarden.io/node"] == NODE
    assert api.taints(NODE) == []  # the other GPUs stay schedulable: no node taint

    writes = len(non_writes(api))
    r.sample()
    r.sample()
    assert len(non_writes(api)) == writes  # one rule, not one per sample

    r.clock.advance(2.5)  # the grace: the GPU is checked, found clean (nothing to clean), let go
    r.sample()
    assert api.rules() == [] and r.cleaned == []
    reasons = [e["reason"] for e in api.events]
    assert reasons.count("GPUDeviceTainted") == 1 and reasons.count("GPUDeviceUntainted") == 1
    assert "GPUTenantLeft" in reasons and "GPUPostCleanVerified" in reasons
    steps = [(e["action"], e["result"]) for e in read_journal(r.settings.state_dir)]
    assert ("device-taint", "set") in steps and ("device-taint", "removed") in steps
    assert not [c for c in api.calls() if c.status == 403]


def test_a_dirty_gpu_is_cleaned_by_policy_verified_and_only_then_let_go(api, rig):
    api.add_resource_slice(NODE, AMD, amd_devices())
    zombie = Holder(pid=4242, start_time=1.0, reason="zombie", gpus=(1,), vram_bytes=14 * GiB)
    dirty = snapshot({1: 14 * GiB}, {1: [zombie]})

    def clean(gpu, may_reset):
        r.current = snapshot()  # the purge took it: the verify's fresh sample is clean
        return FixOutcome(True, "purged pid 4242")
    r = rig(clean=clean)
    r.kubelet.assign("team-a", "trainer-0", "main", "amd.com/gpu", ["0000:11:00.0"])  # a device-plugin pod
    r.sample(dirty)
    (rule,) = api.rules()  # the dead holder alone excludes it (residual, held by a zombie)
    assert rule["spec"]["taint"]["value"] == "dead-holders"
    r.kubelet.remove_pod("team-a", "trainer-0")
    r.sample()
    r.clock.advance(3)
    r.sample()
    r.wait_clean()
    assert r.cleaned == [(1, False)]  # no reset: the node's policy does not allow one
    assert len(api.rules()) == 1  # the rule waits for the reconciler to hear the verify
    r.sample()
    assert api.rules() == []
    message = next(e["message"] for e in api.events if e["reason"] == "GPUPostCleanVerified")
    assert "GPU 1" in message and "cleaned and verified (purged pid 4242)" in message


def test_a_clean_that_fails_keeps_the_gpu_excluded_and_says_what_to_do(api, rig):
    api.add_resource_slice(NODE, AMD, amd_devices())
    leak = snapshot({3: 14 * GiB})
    r = rig(clean=lambda gpu, may_reset: FixOutcome(False, "step reset failed: not allowed"), grace=1.0)
    r.kubelet.assign("team-a", "w", "main", "amd.com/gpu", ["0000:13:00.0"])
    r.sample(snapshot())
    r.kubelet.remove_pod("team-a", "w")
    r.sample(leak)
    r.clock.advance(1.5)
    r.sample()
    r.wait_clean()
    r.sample()
    (rule,) = api.rules()
    assert rule["spec"]["deviceSelector"]["device"] == "gpu-3-131"
    failed = next(e for e in api.events if e["reason"] == "GPUPostCleanFailed")
    assert failed["type"] == "Warning" and "gpuwarden fix 3" in failed["message"]
    assert r.node.status()["post_clean"]["gpus"]["3"]["phase"] == "failed"
    # An operator's fix later: the next clean sample lets it go (verified by the check), the rule goes.
    r.sample(snapshot())
    r.sample()
    assert api.rules() == []


def test_a_reset_is_allowed_only_when_everything_it_reaches_is_free(api, rig):
    api.add_resource_slice(NODE, AMD, amd_devices())
    hive = snapshot({2: 14 * GiB})
    hive = replace(hive, gpus=tuple(replace(g, hive_id="0xabc" if g.index in (2, 3) else None) for g in hive.gpus))
    r = rig(allow_reset=True, grace=0.5)
    for pod, bus in (("a", "0000:12:00.0"), ("b", "0000:13:00.0")):
        r.kubelet.assign("team-a", pod, "main", "amd.com/gpu", [bus])
    r.sample(hive)
    r.kubelet.remove_pod("team-a", "a")
    r.sample()
    r.clock.advance(1)
    r.sample()
    r.wait_clean()
    assert r.cleaned == [(2, False)]  # GPU 3 of its hive still has pod b: no reset
    assert "no reset: it would reach GPU 3 in use" in r.node.cleaner.leftovers[2].history
    r.kubelet.remove_pod("team-a", "b")  # now every GPU the reset reaches is free
    r.sample()
    r.clock.advance(61)  # the failed clean's retry
    r.sample()
    r.wait_clean()
    assert r.cleaned == [(2, False), (2, True)]


def test_noexecute_is_an_opt_in_and_the_node_taint_leaves_covered_gpus_to_the_rules(api, rig):
    api.add_resource_slice(NODE, AMD, amd_devices())
    r = rig(effect="NoExecute", taint_after=0.0)
    r.sample(snapshot({0: 14 * GiB}))
    (rule,) = api.rules()
    assert rule["spec"]["taint"]["effect"] == "NoExecute" and rule["spec"]["taint"]["value"] == "residual-vram"
    r.sample()
    assert api.taints(NODE) == []  # the device rule covers GPU 0: the node's other GPUs stay schedulable


def test_without_dra_the_node_taint_stays_as_it_was(api, rig):
    api.dra_versions = {}
    r = rig(taint_after=0.0)
    r.sample(snapshot({0: 14 * GiB}))
    r.sample()
    assert api.rules() == [] and not r.node.device_taints.active
    assert api.taints(NODE) == [{"key": NODE_TAINT, "value": "residual-vram", "effect": "NoSchedule"}]


def test_missing_rbac_is_one_line_with_the_fix_and_retried_slowly(api, rig):
    api.add_resource_slice(NODE, AMD, amd_devices())
    api.allowed = cluster_role_rules() - {("create", "devicetaintrules")}
    r = rig(taint_after=0.0)
    r.sample(snapshot({0: 14 * GiB}))
    problem = r.node.device_taints.problem
    assert "403" in problem and "devicetaintrules" in problem and "rbac.yaml" in problem
    denied = len([c for c in api.calls() if c.status == 403])
    for _ in range(5):
        r.sample()
    assert len([c for c in api.calls() if c.status == 403]) == denied  # not hammered: retried after a while
    assert any("devicetaintrules" in w.message for w in r.sample().warnings)
    # The rule could not be written: the node taint keeps the GPU from new tenants instead (fails safe).
    assert api.taints(NODE) == [{"key": NODE_TAINT, "value": "residual-vram", "effect": "NoSchedule"}]


def test_a_restarted_agent_adopts_its_rules_and_a_racing_create_is_one_rule(api, tmp_path):
    api.add_resource_slice(NODE, AMD, amd_devices())
    snap = snapshot({1: 14 * GiB})
    first = DeviceTaints(api.kube(), NODE)
    first.reconcile({1: "residual-vram"}, snap.gpus)
    second = DeviceTaints(api.kube(), NODE)  # a new agent: it lists its node's rules at start
    second.reconcile({1: "residual-vram"}, snap.gpus)
    assert len(api.rules()) == 1 and list(second.rules) == list(first.rules)
    third = DeviceTaints(api.kube(), NODE)
    third.start(snap.gpus)
    third.rules.clear()  # as if it had not seen the rule: its create meets a 409 AlreadyExists
    third.reconcile({1: "residual-vram"}, snap.gpus)
    assert len(api.rules()) == 1 and third.problem is None
    second.reconcile({}, snap.gpus)
    assert api.rules() == []
    third.reconcile({}, snap.gpus)  # already gone: a 404 on delete is the wanted state
    assert third.problem is None and third.rules == {}


@pytest.mark.parametrize("k8s, version", [("1.36.0", "v1beta2"), ("1.37.0", "v1")])
def test_the_rules_gpuwarden_writes_and_the_slices_it_reads_validate_against_the_api(api, k8s, version):
    """kubernetes-validate (strict: unknown fields fail) with the release's own schemas: DeviceTaintRule is beta
    (v1beta2) in 1.36 and v1 in 1.37; the stand-in's ResourceSlices have the v1 shape the drivers publish."""
    import kubernetes_validate
    api.dra_versions = {version: {"resourceslices", "devicetaintrules"}}
    api.add_resource_slice(NODE, AMD, amd_devices(2, {1: 2}))
    taints = DeviceTaints(api.kube(), NODE, effect="NoExecute")
    taints.reconcile({0: "tenant-left", 1: "clean-failed"}, snapshot(gpus=2).gpus)
    rules = api.rules()
    assert len(rules) == 3  # GPU 0, and each of GPU 1's two partitions
    for rule in rules:
        kubernetes_validate.validate({**rule, "apiVersion": f"resource.k8s.io/{version}"}, k8s, strict=True)
    listed = api.kube().request("list", "GET", f"/apis/resource.k8s.io/{version}/resourceslices")
    assert listed["items"]
    for item in listed["items"]:
        kubernetes_validate.validate(item, k8s, strict=True)
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": "t", "audiences": ["gpuwarden"]}}
    kubernetes_validate.validate(review, k8s, strict=True)
