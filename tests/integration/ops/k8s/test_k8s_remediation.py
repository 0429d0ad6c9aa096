"""Remediation with proof (issue 27 item 3), on the sim node and the API-server stand-in under the shipped
ClusterRole: the real Kubernetes mode (KubernetesNode, its reconciler and remediation threads) fed with real
samples, fixing through the real fix playbook. The end-to-end run with a PodDisruptionBudget and a crashed
agent is the real `gpuwarden agent --kubernetes` (the last test).
"""

from __future__ import annotations

import json
import signal
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.agentnode import start_agent
from helpers.cli import gpuwarden
from helpers.k8s import GiB, cluster_role_rules, snapshot
from gpuwarden.ops.config.kubernetes import KubernetesConfig
from gpuwarden.ops.k8s.evict import CORDON_ANNOTATION
from gpuwarden.ops.k8s.nodesignal import CONDITION, HELD_TAINT, TAINT_KEY
from gpuwarden.ops.services.k8s_remediation import LAST_ANNOTATION, STATE_ANNOTATION, select_victims
from gpuwarden.ops.foundation.model import PodGpus
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
from helpers.journal import read_journal
from helpers.simnode import start_tenant, wait_for
from standins.kube_apiserver import FakeApiServer
from standins.podresources_server import PodResourcesServer

SIM_NODE = {"gpus": 4, "vram": "24GiB"}
NS = "gpuwarden"
FAST = {"backoff_s": 0.2, "poll_s": 0.1, "retry_s": 0.5, "wait_poll_s": 0.2}


def reasons(api: FakeApiServer, node: str) -> list[str]:
    return [e["reason"] for e in list(api.events) if e["involvedObject"]["name"] == node]


def message(api: FakeApiServer, node: str, reason: str) -> str:
    return next((e["message"] for e in reversed(list(api.events))
                if e["involvedObject"]["name"] == node and e["reason"] == reason), "")


class FedNode:
    """A KubernetesNode in this process, fed a fresh sample every 0.1 s as the agent's sampler would."""

    def __init__(self, api: FakeApiServer, settings: Settings, name: str, tmp: Path, fixer=None, **cfg):
        from gpuwarden.ops.services.k8s_node import KubernetesNode
        from gpuwarden.playbooks.k8s_remediate import fixer as fix_playbook
        self.settings = settings
        config = KubernetesConfig(node_name=name, taint_after=0.3, clear_after=0.5, remediate=True,
                                  remediate_after=0.8, eviction_timeout=10.0,
                                  pod_resources_socket=str(tmp / f"{name}-none.sock"), **cfg)
        self.node = KubernetesNode(settings, config, kube=api.kube(), fixer=fixer or fix_playbook(settings),
                                   remediation_tuning=dict(FAST))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        from gpuwarden.ops.sampling.sampler import take_snapshot
        while not self._stop.wait(0.1):
            self.node.on_snapshot(self.node.annotate(take_snapshot(self.settings, deep=False)))

    def __enter__(self) -> "FedNode":
        self.node.start(sync_timeout_s=2.0)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.node.close()

    @property
    def phase(self) -> str:
        assert self.node.remediator is not None
        return self.node.remediator.phase


@pytest.fixture
def api():
    server = FakeApiServer().start()
    server.allowed = cluster_role_rules()  # the shipped ClusterRole is all the loop may use
    yield server
    server.stop()


def test_remediation_is_off_by_default_and_its_keys_are_checked():
    from gpuwarden.ops.config.kubernetes import parse

    def fail(key, problem, hint):
        return ValueError(f"{key}: {problem}")
    assert KubernetesConfig().remediate is False and parse({}, fail).remediate is False
    cfg = parse({"remediate": True, "remediate_after": "90s", "remediation_slots": 3, "remediation_interval": "2h",
                 "eviction_timeout": "1m", "lease_namespace": "ops"}, fail)
    assert (cfg.remediate, cfg.remediate_after, cfg.remediation_slots, cfg.remediation_interval,
            cfg.eviction_timeout, cfg.lease_namespace) == (True, 90.0, 3, 7200.0, 60.0, "ops")
    for bad, key in (({"remediate": "yes"}, "remediate"), ({"remediation_slots": 0}, "remediation_slots"),
                     ({"remediation_slots": True}, "remediation_slots"), ({"eviction_timeout": "soon"}, "eviction_timeout"),
                     ({"remediate": True, "policy": "off"}, "remediate")):
        with pytest.raises(ValueError, match=f"^{key}: "):
            parse(bad, fail)


def test_the_pods_a_reset_reaches_are_the_ones_evicted():
    """GPU 2 alone: its pods go, not GPU 0's; GPU 2 in a hive of every GPU: every GPU pod goes, but never a
    DaemonSet's or a pod without a GPU."""
    def pod(name, gpu=True, owner=None):
        meta = {"namespace": "t", "name": name, "uid": f"uid-{name}"}
        if owner:
            meta["ownerReferences"] = [{"kind": owner, "name": "x"}]
        limits = {"limits": {"amd.com/gpu": "1"}} if gpu else {}
        return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": limits}]},
                "status": {"phase": "Running"}}
    pods = [pod("on-2"), pod("on-0"), pod("web", gpu=False), pod("plugin", owner="DaemonSet"), pod("unnamed")]
    assigned = (PodGpus("t", "on-2", "c", (2,)), PodGpus("t", "on-0", "c", (0,)), PodGpus("t", "plugin", "c", (2,)))
    snap = replace(snapshot({2: 14 * GiB}), pods=assigned)
    victims, left, scope, whole = select_victims(snap, pods, [2], Path("/nonexistent"))
    # unnamed asks for a GPU the kubelet did not name: it could be GPU 2, so it goes too.
    assert [v.name for v in victims] == ["on-2", "unnamed"] and scope == {2} and not whole
    assert left == ["t/plugin (a DaemonSet's pod: a cordon does not keep it off the node)"]
    hive = replace(snap, gpus=tuple(replace(g, hive_id="0xabc") for g in snap.gpus))
    victims, left, scope, whole = select_victims(hive, pods, [2], Path("/nonexistent"))
    assert [v.name for v in victims] == ["on-0", "on-2", "unnamed"] and scope == {0, 1, 2, 3} and whole
    assert len(left) == 1


@pytest.mark.slow
def test_a_reset_that_fails_leaves_the_node_cordoned_and_tainted_with_the_reason(api, sim_settings, tmp_path):
    node = "gpu-node-1"
    api.add_node(node)
    sim = SimNode(sim_settings.state_dir)
    sim.set_fault("reset-fails", True)
    with FedNode(api, sim_settings, node, tmp_path) as fed:
        sim.leak(2, 8 * GiB)
        wait_for(lambda: fed.phase == "failed", timeout=40, what="the remediation to fail")
        wait_for(lambda: [t for t in api.taints(node) if t["value"] == HELD_TAINT], timeout=10,
                 what="the taint saying the remediation failed")
        n = api.node(node)
        assert n["spec"]["unschedulable"] is True
        assert n["metadata"]["annotations"][CORDON_ANNOTATION] == "gpuwarden-remediation"
        state = json.loads(n["metadata"]["annotations"][STATE_ANNOTATION])
        assert state["phase"] == "failed" and "reset failed" in state["reason"] and state["gpus"] == [2]
        assert api.taints(node) == [{"key": TAINT_KEY, "value": HELD_TAINT, "effect": "NoSchedule"}]
        cond = wait_for(lambda: (lambda c: c if c["reason"] == "RemediationFailed" else None)(
            api.condition(node, CONDITION)), what="the condition naming the failure")
        assert cond["status"] == "True" and "reset failed" in cond["message"] and "GPU 2" in cond["message"]
        said = reasons(api, node)
        assert said.index("RemediationCordoned") < said.index("RemediationFixFailed") < said.index("RemediationFailed")
        assert "reset failed" in message(api, node, "RemediationFailed")
        assert api.leases[(NS, "gpuwarden-remediation-0")]["spec"].get("holderIdentity") is None  # the slot is free
        steps = [(e["action"], e["result"]) for e in read_journal(sim_settings.state_dir)
                 if e["action"].startswith("remediate")]
        assert steps[:2] == [("remediate:cordon", "ok"), ("remediate:evict", "ok")]
        assert ("remediate:fix", "failed") in steps and steps[-1] == ("remediate", "failed")
        # It stays so (no retry, no uncordon) until a person fixes the GPU; then it lets the node go.
        sim.set_fault("reset-fails", False)
        from gpuwarden.playbooks.fix import FixPlaybook
        from gpuwarden.playbooks.framework import run
        assert run(FixPlaybook(2), sim_settings, assume_yes=True).ok
        wait_for(lambda: fed.phase == "idle", timeout=20, what="the hold to be lifted")
        wait_for(lambda: not api.taints(node), timeout=10, what="the taint to go")
        n = api.node(node)
        assert not n["spec"].get("unschedulable") and STATE_ANNOTATION not in n["metadata"]["annotations"]
        assert "RemediationCleared" in reasons(api, node)
    assert not [r for r in api.calls() if r.status == 403]


def test_two_agents_competing_for_one_slot_never_remediate_together(api, sim_settings, tmp_path):
    other_dir = tmp_path / "state-b"
    other_dir.mkdir()
    SimNode(other_dir).init(gpus=4, vram=24 * GiB)
    settings = {"node-a": sim_settings, "node-b": replace(sim_settings, state_dir=other_dir,
                                                          config_path=other_dir / "node.toml")}
    for name in settings:
        api.add_node(name)
    from gpuwarden.playbooks.k8s_remediate import fixer as fix_playbook
    lock = threading.Lock()
    fixing: list[str] = []
    seen: dict[str, object] = {"most": 0, "first": None}
    feds: dict[str, FedNode] = {}

    def fixer(name):
        real = fix_playbook(settings[name])

        def fix(gpu, cancelled):
            with lock:
                fixing.append(name)
                seen["most"] = max(seen["most"], len(fixing))
                first = seen["first"] is None
                seen["first"] = seen["first"] or name
            try:
                if first:  # hold the slot until the other node is seen waiting for it, uncordoned
                    other = next(n for n in feds if n != name)
                    wait_for(lambda: feds[other].phase == "waiting-slot", timeout=20, what="the other to wait")
                    assert not api.node(other)["spec"].get("unschedulable")
                return real(gpu, cancelled)
            finally:
                with lock:
                    fixing.remove(name)
        return fix
    for name in settings:
        feds[name] = FedNode(api, settings[name], name, tmp_path, fixer=fixer(name), remediation_slots=1)
    with feds["node-a"], feds["node-b"]:
        for name in settings:  # both nodes leak at once: both are due at about the same time
            SimNode(settings[name].state_dir).leak(1, 6 * GiB)
        for name in settings:
            wait_for(lambda name=name: "RemediationDone" in reasons(api, name), timeout=60,
                     what=f"{name}'s remediation")
        # A new leak within remediation_interval (1 h by default) waits: one remediation per node per interval.
        SimNode(settings["node-a"].state_dir).leak(3, 6 * GiB)
        wait_for(lambda: "at most one remediation per 3600s" in message(api, "node-a", "RemediationWaiting"),
                 timeout=20, what="the per-node rate limit")
        assert feds["node-a"].phase == "rate-limited"
        assert not api.node("node-a")["spec"].get("unschedulable")
    assert seen["most"] == 1
    first = seen["first"]
    second = next(n for n in settings if n != first)
    events = [(e["involvedObject"]["name"], e["reason"]) for e in api.events]
    # The second node's cordon comes after the first one's remediation is done (and its slot released).
    assert events.index((first, "RemediationDone")) < events.index((second, "RemediationCordoned"))
    assert any("cluster remediation slot" in e["message"] for e in api.events
               if e["involvedObject"]["name"] == second and e["reason"] == "RemediationWaiting")
    lease = api.leases[(NS, "gpuwarden-remediation-0")]
    assert lease["spec"].get("holderIdentity") is None and lease["spec"]["leaseTransitions"] == 1
    for name in settings:
        n = api.node(name)
        assert not n["spec"].get("unschedulable") and (name == "node-a" or not api.taints(name))
        assert LAST_ANNOTATION in n["metadata"]["annotations"]  # the per-node rate limit's record
    assert not [r for r in api.calls() if r.status == 403]


UID = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
CID = "ab" * 32
BUS = {0: "0000:10:00.0", 2: "0000:12:00.0"}  # the sim's GPUs 0 and 2


@pytest.mark.slow
def test_leak_to_cordon_pdb_eviction_crash_resume_reset_verify_uncordon(sim_state, tmp_path):
    """The real agent: a leak under a tenant's pod -> condition -> taint -> (grace) cordon -> the eviction refused
    by a PodDisruptionBudget (429) -> the agent is killed -> a new agent resumes from the node's annotation ->
    another replica becomes ready: evicted -> fix (reset, verify) -> uncordon, untaint, slot released; every verb
    the run used is one the shipped ClusterRole grants, and it used each of them."""
    node = "gpu-node-1"
    api = FakeApiServer().start()
    api.allowed = cluster_role_rules()
    api.add_node(node)
    api.add_pod("team-a", "trainer-0", node, uid=UID, containers={"main": f"containerd://{CID}"},
                labels={"app": "trainer"}, limits={"amd.com/gpu": 1})
    api.add_pod("team-a", "trainer-1", "gpu-node-2", labels={"app": "trainer"}, ready=False,
                limits={"amd.com/gpu": 1})  # its replica elsewhere, still starting
    api.add_pod("team-b", "notebook", node, limits={"amd.com/gpu": 1})  # on GPU 0: the reset of GPU 2 spares it
    api.add_pdb("team-a", "trainer-pdb", {"app": "trainer"}, min_available=1)
    pr = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    pr.assign("team-a", "trainer-0", "main", "amd.com/gpu", [BUS[2]])
    pr.assign("team-b", "notebook", "main", "amd.com/gpu", [BUS[0]])
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "node.toml"
    config.write_text('[kubernetes]\ntaint_after = "1s"\nclear_after = "1s"\nremediate = true\n'
                      'remediate_after = "2s"\neviction_timeout = "90s"\n'
                      f'pod_resources_socket = "{tmp_path / "kubelet.sock"}"\n')
    tenant = start_tenant(sim_state, 2, "4GiB")  # trainer-0's process: the eviction must stop it before the reset

    def kubelet_stops(namespace, name):
        if name == "trainer-0":
            tenant.kill()
            tenant.wait()
            pr.remove_pod(namespace, name)
    api.on_delete.append(kubelet_stops)
    run = {"args": ("--config", str(config)), "env": {"KUBECONFIG": str(kubeconfig)},
           "agent_args": ("--kubernetes", "--node-name", node)}
    agent = second = None
    try:
        agent = start_agent(sim_state, *run["args"], env=run["env"], agent_args=run["agent_args"])
        wait_for(lambda: api.condition(node, CONDITION), timeout=30, what="the condition from the agent's start")
        gpuwarden("--state-dir", str(sim_state), "--backend", "sim", "sim", "leak", "--gpu", "2", "--size", "8GiB",
                  check=True)
        wait_for(lambda: "RemediationEvictionBlocked" in reasons(api, node), timeout=40,
                 what="the eviction refused by the PodDisruptionBudget")
        said = reasons(api, node)
        assert said.index("GPUResidualVRAM") < said.index("GPUTainted") < said.index("RemediationCordoned")
        assert "trainer-pdb needs 1 healthy pods and has 1 currently" in message(api, node,
                                                                                 "RemediationEvictionBlocked")
        assert api.node(node)["spec"]["unschedulable"] is True and tenant.poll() is None
        assert [r.status for r in api.calls() if r.resource == "pods/eviction"][:1] == [429]

        # The agent dies mid-loop; the node's annotation says where it was, and a new agent resumes.
        agent.stop(signal.SIGKILL)
        state = json.loads(api.node(node)["metadata"]["annotations"][STATE_ANNOTATION])
        assert state["phase"] == "evict" and state["gpus"] == [2]
        blocked = len([e for e in api.events if e["reason"] == "RemediationEvictionBlocked"])
        second = start_agent(sim_state, *run["args"], env=run["env"], agent_args=run["agent_args"])
        wait_for(lambda: "RemediationResumed" in reasons(api, node), timeout=30, what="the resumed remediation")
        wait_for(lambda: len([e for e in api.events if e["reason"] == "RemediationEvictionBlocked"]) > blocked,
                 timeout=30, what="the resumed eviction refused again")
        api.set_ready("team-a", "trainer-1")  # another replica is ready: the budget allows one disruption
        wait_for(lambda: "RemediationDone" in reasons(api, node), timeout=60, what="the remediation to finish")
        n = api.node(node)
        assert not n["spec"].get("unschedulable") and not api.taints(node)
        assert STATE_ANNOTATION not in n["metadata"]["annotations"] and CORDON_ANNOTATION not in n["metadata"]["annotations"]
        assert api.condition(node, CONDITION)["status"] == "False"
        assert api.leases[(NS, "gpuwarden-remediation-0")]["spec"].get("holderIdentity") is None
        assert ("team-a", "trainer-0") not in api.pods and ("team-b", "notebook") in api.pods
        assert SimNode(sim_state).describe()["resets"] == {2: 1}
        said = reasons(api, node)
        order = ["RemediationResumed", "RemediationEvicting", "RemediationEvicted", "RemediationFixed",
                 "RemediationVerified", "RemediationDone"]
        assert [r for r in said[said.index("RemediationResumed"):] if r in order] == order
        assert "GPU 2 is clean and verified after a reset" in message(api, node, "RemediationFixed")
        steps = [(e["action"], e["result"]) for e in read_journal(sim_state) if e["action"].startswith("remediate")]
        assert steps[0] == ("remediate:cordon", "ok") and ("remediate", "resumed") in steps
        assert steps[-3:] == [("remediate:fix", "ok"), ("remediate:verify", "ok"), ("remediate", "ok")]
        kube_lines = wait_for(lambda: (lambda lines: lines if "gpuwarden_kubernetes_remediating 0.0" in lines else None)(
            second.get("/metrics").body.decode().splitlines()), what="the metrics to show the remediation over")
        assert "gpuwarden_kubernetes_remediation_failed 0.0" in kube_lines
        assert second.json("/v1/snapshot")["kubernetes"]["remediation"]["done"] == 1
        # Under the shipped ClusterRole: nothing refused, and the run used every verb it grants (no more).
        assert not [r for r in api.calls() if r.status == 403]
        # (discovery is every user's; this node publishes no ResourceSlice, so no DeviceTaintRule is written, and
        # no tenant asks the gpu-check gate: those verbs are tests/integration/ops/k8s/test_k8s_dra.py's and test_k8s_gate.py's)
        unused = {("create", "devicetaintrules"), ("delete", "devicetaintrules"), ("create", "tokenreviews")}
        assert {(r.verb, r.resource) for r in api.calls() if r.verb != "discover"} == cluster_role_rules() - unused
        assert not [r for r in api.calls() if r.method == "DELETE"]  # pods leave through evictions only
    finally:
        for a in (agent, second):
            if a is not None and a.proc.poll() is None:
                a.stop(timeout=20)
            if a is not None:
                print(a.log_text()[-3000:])
        print("\n".join(f"{e['reason']}: {e['message'][:300]}" for e in api.events))
        if tenant.poll() is None:
            tenant.kill()
            tenant.wait()
        pr.stop()
        api.stop()
