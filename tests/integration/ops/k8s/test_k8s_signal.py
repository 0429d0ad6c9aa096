"""The node condition and taint, reconciled against the API-server stand-in through the official client."""

from __future__ import annotations


import pytest

from helpers.k8s import NODE, Clock, GiB, api, snapshot  # noqa: F401  (api is a fixture)
from gpuwarden.ops.k8s.nodesignal import CONDITION, OWNER_ANNOTATION, TAINT_KEY, NodeSignal
from gpuwarden.ops.foundation.model import Holder


def make(api, clock, **kw):
    events = []
    sig = NodeSignal(api.kube(), NODE, clock=clock, wall=lambda: clock() + 1.7e9,
                     events=lambda r, m, k: events.append((r, m, k)),
                     **{"taint_after_s": 120, "clear_after_s": 10, "retry_s": 30, **kw})
    return sig, events


def writes(api, since=0.0):
    return [r for r in api.calls(since) if r.method != "GET"]


def test_a_clean_node_says_so_from_the_start_then_stays_quiet(api):
    clock = Clock()
    sig, events = make(api, clock)
    sig.observe(snapshot())
    cond = api.condition(NODE, CONDITION)
    assert cond["status"] == "False" and cond["reason"] == "NoResidualVRAM"
    assert cond["lastTransitionTime"] and cond["lastHeartbeatTime"]
    assert api.condition(NODE, "Ready")["status"] == "True"  # merged by type: the kubelet's condition stays
    first = len(api.calls())
    assert first == 2  # one GET at start, one status patch
    for _ in range(120):  # two minutes of 1 Hz samples on a quiet node
        clock.advance(1)
        sig.observe(snapshot())
    assert len(api.calls()) == first
    assert events == [] and api.taints(NODE) == []


def test_residual_sets_the_condition_at_once_and_the_taint_after_the_grace(api):
    clock = Clock()
    sig, events = make(api, clock)
    sig.observe(snapshot())
    transition = api.condition(NODE, CONDITION)["lastTransitionTime"]
    zombie = Holder(pid=4242, start_time=1.0, reason="zombie", gpus=(2,), vram_bytes=14 * GiB,
                    namespace="team-a", pod="trainer-0", pod_deleted_at=5.0)
    bad = snapshot({2: 14 * GiB}, {2: [zombie]})
    clock.advance(1)
    sig.observe(bad)
    cond = api.condition(NODE, CONDITION)
    assert cond["status"] == "True" and cond["reason"] == "ResidualVRAM"
    assert "GPU 2: 14.0 GiB held by pid 4242 (zombie) of pod team-a/trainer-0 (deleted)" in cond["message"]
    assert cond["lastTransitionTime"] != transition  # False -> True: a new transition time
    flipped = cond["lastTransitionTime"]
    assert api.taints(NODE) == []
    clock.advance(118)
    sig.observe(bad)
    assert api.taints(NODE) == []
    clock.advance(2)
    sig.observe(bad)
    assert api.taints(NODE) == [{"key": TAINT_KEY, "value": "residual-vram", "effect": "NoSchedule"}]
    assert api.node(NODE)["metadata"]["annotations"][OWNER_ANNOTATION] == "gpuwarden-agent"
    worse = snapshot({2: 15 * GiB}, {2: [zombie]})
    sig.observe(worse)  # a new message, the same status: the transition time stays
    cond = api.condition(NODE, CONDITION)
    assert "15.0 GiB" in cond["message"] and cond["lastTransitionTime"] == flipped
    bad = worse
    assert [e[0] for e in events] == ["GPUResidualVRAM", "GPUTainted"]
    before = len(api.calls())
    for _ in range(30):
        clock.advance(1)
        sig.observe(bad)
    assert len(api.calls()) == before  # nothing changed: nothing sent


def test_the_taint_goes_only_after_the_gpus_are_verified_clean(api):
    clock = Clock()
    sig, events = make(api, clock, taint_after_s=0)
    sig.observe(snapshot({1: 3 * GiB}))
    assert api.taints(NODE)
    t_true = api.condition(NODE, CONDITION)["lastTransitionTime"]
    assert api.condition(NODE, CONDITION)["status"] == "True"
    clock.advance(1)
    sig.observe(snapshot())  # clean for a moment: the condition follows at once, the taint waits
    assert api.condition(NODE, CONDITION)["status"] == "False"
    assert api.taints(NODE)
    clock.advance(5)
    sig.observe(snapshot())
    assert api.taints(NODE)
    clock.advance(5)
    sig.observe(snapshot())
    assert api.taints(NODE) == []
    assert OWNER_ANNOTATION not in (api.node(NODE)["metadata"].get("annotations") or {})
    assert api.condition(NODE, CONDITION)["lastTransitionTime"] != t_true  # flipped back: a new transition
    assert [e[0] for e in events][-1] == "GPUUntainted"


def test_a_verified_purge_clears_the_taint_without_waiting(api):
    clock = Clock()
    sig, _ = make(api, clock, taint_after_s=0, clear_after_s=600)
    sig.observe(snapshot({3: 2 * GiB}))
    assert api.taints(NODE)
    clock.advance(1)
    sig.observe(snapshot(), verified=frozenset({3}))
    assert api.taints(NODE) == []


def test_a_failed_reset_taints_at_once(api):
    clock = Clock()
    sig, _ = make(api, clock)
    sig.observe(snapshot({0: 6 * GiB}), reset_needed=frozenset({0}))
    assert api.taints(NODE) == [{"key": TAINT_KEY, "value": "reset-needed", "effect": "NoSchedule"}]
    assert api.condition(NODE, CONDITION)["reason"] == "ResetNeeded"


def test_other_taints_are_kept_and_a_foreign_taint_with_our_key_is_never_touched(api):
    api.edit_node(NODE, lambda n: n["spec"].update(taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
    clock = Clock()
    sig, _ = make(api, clock, taint_after_s=0, clear_after_s=0)
    sig.observe(snapshot({2: 2 * GiB}))
    assert api.taints(NODE) == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                                {"key": TAINT_KEY, "value": "residual-vram", "effect": "NoSchedule"}]
    clock.advance(1)
    sig.observe(snapshot())
    assert api.taints(NODE) == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]

    # An administrator sets our key by hand: gpuwarden neither removes nor changes it.
    foreign = {"key": TAINT_KEY, "value": "manual", "effect": "NoSchedule"}
    api.edit_node(NODE, lambda n: n["spec"]["taints"].append(foreign))
    sig2, _ = make(api, Clock(), taint_after_s=0, clear_after_s=0)
    sig2.observe(snapshot({2: 2 * GiB}))
    sig2.observe(snapshot())
    assert foreign in api.taints(NODE)
    assert sig2.status()["foreign_taint"] is True


def test_conflicts_are_retried_with_a_fresh_resource_version(api):
    clock = Clock()
    sig, _ = make(api, clock, taint_after_s=0)
    api.conflict_next = 2
    sig.observe(snapshot({1: 2 * GiB}))
    assert api.taints(NODE)
    spec_patches = [r for r in api.calls() if r.resource == "nodes" and r.method == "PATCH"]
    assert [r.status for r in spec_patches] == [409, 409, 200]
    gets_between = [r for r in api.calls() if r.resource == "nodes" and r.method == "GET"]
    assert len(gets_between) >= 4  # start + one fresh read before each try
    assert sig.problem is None


def test_rbac_refusal_is_one_line_and_retried_slowly(api):
    clock = Clock()
    logged = []
    api.denied.add(("patch", "nodes/status"))
    sig = NodeSignal(api.kube(), NODE, clock=clock, retry_s=30, log=lambda level, text: logged.append(text))
    for _ in range(60):
        sig.observe(snapshot())
        clock.advance(1)
    assert "cannot patch resource \"nodes/status\"" in sig.problem and "rbac.yaml" in sig.problem
    assert len(logged) == 1  # one line, not one per sample
    refused = [r for r in api.calls() if r.status == 403]
    assert len(refused) == 1  # retried after 4 x retry_s, not every second
    api.denied.clear()
    clock.advance(120)
    sig.observe(snapshot())
    assert sig.problem is None and api.condition(NODE, CONDITION)["status"] == "False"
    assert logged[-1].endswith("working again")


def test_policy_condition_never_taints_and_off_never_calls(api):
    clock = Clock()
    sig, _ = make(api, clock, policy="condition", taint_after_s=0)
    sig.observe(snapshot({2: 2 * GiB}))
    clock.advance(300)
    sig.observe(snapshot({2: 2 * GiB}))
    assert api.condition(NODE, CONDITION)["status"] == "True" and api.taints(NODE) == []
    # A node tainted under the taint policy is untainted once the policy is the condition only.
    tainter, _ = make(api, clock, taint_after_s=0)
    tainter.observe(snapshot({2: 2 * GiB}))
    assert api.taints(NODE)
    sig2, _ = make(api, clock, policy="condition")
    sig2.observe(snapshot({2: 2 * GiB}))
    assert api.taints(NODE) == [] and api.condition(NODE, CONDITION)["status"] == "True"
    n = len(api.calls())
    off, _ = make(api, clock, policy="off")
    off.observe(snapshot({2: 2 * GiB}))
    assert len(api.calls()) == n


def test_a_heartbeat_every_few_minutes_is_the_only_cost_of_a_quiet_node(api):
    clock = Clock()
    sig, _ = make(api, clock, heartbeat_s=300)
    sig.observe(snapshot())
    for _ in range(600):
        clock.advance(1)
        sig.observe(snapshot())
    assert len(writes(api)) == 3  # the first write, then at 300 s and 600 s: 0.2 calls a minute


def test_the_standin_applies_json_patch_with_its_test_operation(api):
    # The client sends a list body as JSON Patch; a failed "test" makes the whole patch fail (RFC 6902).
    from kubernetes.client.exceptions import ApiException
    kube = api.kube()
    rv = api.node(NODE)["metadata"]["resourceVersion"]
    kube.core.patch_node(NODE, [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                                {"op": "add", "path": "/spec/unschedulable", "value": True}])
    assert api.node(NODE)["spec"]["unschedulable"] is True
    with pytest.raises(ApiException) as err:
        kube.core.patch_node(NODE, [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                                    {"op": "remove", "path": "/spec/unschedulable"}])
    assert err.value.status == 422
    assert api.node(NODE)["spec"]["unschedulable"] is True


def test_sighup_applies_a_new_grace_and_policy_off_lifts_our_taint(api, tmp_path):
    from dataclasses import replace

    from gpuwarden.ops.config.kubernetes import KubernetesConfig
    from gpuwarden.ops.services.k8s_node import KubernetesNode
    from gpuwarden.ops.foundation.settings import Settings
    cfg = KubernetesConfig(node_name=NODE, taint_after=120.0, pod_resources_socket=str(tmp_path / "none.sock"))
    table = {"cfg": cfg}
    node = KubernetesNode(Settings(state_dir=tmp_path), cfg, kube=api.kube(), log=lambda level, text: None,
                          reread=lambda: table["cfg"])
    leak = snapshot({2: 14 * GiB})
    node.process(leak)
    assert api.condition(NODE, CONDITION)["status"] == "True" and api.taints(NODE) == []
    table["cfg"] = replace(cfg, taint_after=0.0)
    node.reload()
    node.process(leak)
    assert api.taints(NODE) == [{"key": TAINT_KEY, "value": "residual-vram", "effect": "NoSchedule"}]
    table["cfg"] = replace(cfg, policy="off")
    node.reload()
    node.process(leak)
    assert api.taints(NODE) == [] and node.status()["policy"] == "off"
