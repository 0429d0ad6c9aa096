"""End to end on the sim node: a pod's process holds GPU 2 and is killed with leak-on-kill; the real
`gpuwarden agent --kubernetes` (official client -> API-server stand-in, real pod-resources proto) names the
pod in its snapshot and metrics, sets the condition, taints after the grace, reports GPU 2 Unhealthy to AMD's
device plugin, and clears it all once a purge with reset has freed the GPU.
"""

from __future__ import annotations

import json
import os
import signal
import time

import grpc
import pytest
from google.protobuf import empty_pb2

from helpers.agentnode import snapshot_of, start_agent
from helpers.cli import gpuwarden
from helpers.k8s import NODE, PodCgroup, cluster_role_rules
from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.bundle.collectors import Context, _snapshot
from gpuwarden.ops.k8s.nodesignal import CONDITION, TAINT_KEY
from gpuwarden.ops.k8s.proto import metricssvc_pb2_grpc
from gpuwarden.ops.foundation.model import snapshot_from_dict
from gpuwarden.ops.foundation.settings import Settings
from helpers.simnode import start_tenant, wait_for
from standins.kube_apiserver import FakeApiServer
from standins.podresources_server import PodResourcesServer

UID = "5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f"
CID = "9e" * 32
GRACE = 3.0


def health(sock: str) -> dict[str, str]:
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        reply = metricssvc_pb2_grpc.MetricsServiceStub(ch).List(empty_pb2.Empty(), timeout=5)
    return {s.ID: s.Health for s in reply.GPUState}


@pytest.mark.slow
def test_leak_on_kill_to_taint_to_purge_and_all_clear(state_dir, tmp_path):
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "init", "--gpus", "4", "--vram", "24GiB",
              check=True)
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "fault", "leak-on-kill", "on", check=True)
    api = FakeApiServer().start()
    api.allowed = cluster_role_rules()  # the shipped ClusterRole is all the agent may use
    api.add_node(NODE)
    api.add_pod("team-a", "trainer-0", NODE, uid=UID, containers={"main": f"containerd://{CID}"})
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    pr = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    pr.assign("team-a", "trainer-0", "main", "amd.com/gpu", ["0000:12:00.0"])  # the sim's GPU 2
    health_sock = str(tmp_path / "amd" / "exporter.socket")
    config = tmp_path / "node.toml"
    config.write_text(f'[kubernetes]\ntaint_after = "{GRACE:g}s"\nclear_after = "2s"\n'
                      f'pod_resources_socket = "{tmp_path / "kubelet.sock"}"\nhealth = true\n'
                      f'health_socket = "{health_sock}"\n')
    cg = PodCgroup(UID, CID)
    tenant = agent = None
    try:
        tenant = start_tenant(state_dir, 2, "14GiB")
        in_pod = cg.add(tenant.pid)
        agent = start_agent(state_dir, "--config", str(config), interval="0.25", env={"KUBECONFIG": str(kubeconfig)},
                            agent_args=("--kubernetes", "--node-name", NODE))
        wait_for(lambda: api.condition(NODE, CONDITION), timeout=30, what="the condition from the agent's start")
        assert api.condition(NODE, CONDITION)["status"] == "False"
        wait_for(lambda: os.path.exists(health_sock) and health(health_sock).get("2") == "healthy", timeout=15,
                 what="the health service")

        # The agent's snapshot (what status and gpu-check read) names the tenant's pod; so do its metrics.
        doc = wait_for(lambda: (lambda d: d if d.get("kubernetes", {}).get("condition") else None)(
            snapshot_of(agent)), what="the Kubernetes block in the agent's snapshot")
        jsondoc.validate(doc)
        assert doc["kubernetes"]["node"] == NODE and doc["kubernetes"]["taint"] is None
        check = json.loads(gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "gpu-check", "2",
                                     "--json").stdout)
        assert check["ok"] is True and check["source"] == "agent"
        if in_pod:
            snap = wait_for(lambda: (lambda s: s if any(p.pod for p in s.processes) else None)(
                snapshot_from_dict(snapshot_of(agent))), what="the tenant's pod on its process")
            row = next(p for p in snap.processes if p.pid == tenant.pid)
            assert (row.namespace, row.pod, row.container_name, row.pod_uid) == ("team-a", "trainer-0", "main", UID)
            assert any(p.pod == "trainer-0" and p.gpus == (2,) for p in snap.pods)
            rows = [line for line in agent.get("/metrics?per_process=1").body.decode().splitlines()
                    if line.startswith("gpuwarden_process_vram_bytes{")]
            assert any(all(f in line for f in ('container="main"', 'namespace="team-a"', 'pod="trainer-0"'))
                       for line in rows), rows
            # A bundle keeps the agent's pod-annotated snapshot beside its own bare one.
            ctx = Context(settings=Settings(state_dir=state_dir, backend="sim"), since_s=None, timeout_s=10,
                          safe_mode=True, sysfs_root=state_dir, dev_roots=[], deadline=time.monotonic() + 10)
            kept = json.loads({e.path: e for e in _snapshot(ctx)}["gpuwarden/agent-snapshot.json"].data)
            assert any(p["pod"] == "trainer-0" for p in kept["pods"])

        # The kubelet kills the pod; its memory stays behind (leak-on-kill), owned by nobody.
        tenant.send_signal(signal.SIGKILL)
        tenant.wait()
        t_leak = time.monotonic()
        api.delete_pod("team-a", "trainer-0")
        pr.remove_pod("team-a", "trainer-0")
        wait_for(lambda: api.condition(NODE, CONDITION)["status"] == "True", timeout=20, what="condition True")
        t_condition = time.monotonic() - t_leak
        cond = api.condition(NODE, CONDITION)
        assert cond["reason"] == "ResidualVRAM" and "GPU 2: 14.0 GiB" in cond["message"]
        wait_for(lambda: "last given to pod team-a/trainer-0, deleted" in api.condition(NODE, CONDITION)["message"],
                 what="the deleted tenant named in the condition")
        assert api.taints(NODE) == []
        wait_for(lambda: health(health_sock) == {"0": "healthy", "1": "healthy", "2": "unhealthy", "3": "healthy"},
                 timeout=10, what="GPU 2 Unhealthy, the others Healthy")
        wait_for(lambda: api.taints(NODE), timeout=GRACE + 20, poll=0.02, what="the taint")
        t_taint = time.monotonic() - t_leak
        assert api.taints(NODE) == [{"key": TAINT_KEY, "value": "residual-vram", "effect": "NoSchedule"}]
        # Not before the grace; the <= grace + 2 s figure is measured by tests/bench/bench_k8s.py, not asserted
        # here, where other work on the machine decides how long a sample takes.
        assert t_taint >= GRACE - 0.05, f"tainted {t_taint:.2f}s after the leak, before the {GRACE}s grace"
        bad = gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "gpu-check", "2")
        assert bad.returncode == 1 and "NOT CLEAN" in bad.stderr and "residual" in bad.stderr
        assert gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "gpu-check", "0").returncode == 0
        metrics = wait_for(lambda: (lambda m: m if "gpuwarden_kubernetes_node_tainted 1" in m else None)(
            agent.get("/metrics").body.decode()), what="the taint in the metrics")
        assert 'namespace="team-a",pod="trainer-0",role="last-tenant"' in metrics
        events = agent.json("/v1/events")["events"]  # the agent's own event log has the taint too
        assert any(e["kind"] == "kubernetes" and "tainted gpuwarden.io/gpu-unhealthy" in e["text"] for e in events)

        # The agent's own post-clean (issue 35) tried the GPU the pod left: the fix without a reset cannot free an
        # ownerless leak, so GPU 2 stays excluded and the Event says what to run. Settled: nothing changes now.
        left = wait_for(lambda: (lambda pc: pc if pc and pc["gpus"].get("2", {}).get("phase") == "failed" else None)(
            snapshot_of(agent)["kubernetes"]["post_clean"]), timeout=GRACE + 30, what="the post-clean's verdict")
        assert left["gpus"]["2"]["pods"] == ["team-a/trainer-0"] and "gpuwarden fix 2" in left["gpus"]["2"]["reason"]
        assert any(e["reason"] == "GPUPostCleanFailed" for e in api.events)

        # Quiet while nothing changes: no writes at all over two seconds of samples.
        quiet_from = time.time()
        wait_for(lambda: snapshot_of(agent)["taken_at"] > quiet_from + 2.0, what="two seconds of samples")
        assert [r for r in api.calls(quiet_from) if r.method != "GET" and r.verb != "watch"] == []

        # The operator purges; only a reset frees an ownerless leak.
        purge = gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "purge", "2", "--escalate-reset",
                          "--yes", "--timeout", "2")
        assert purge.returncode == 0, purge.stdout + purge.stderr
        wait_for(lambda: not api.taints(NODE), timeout=15, what="the taint to go")
        assert api.condition(NODE, CONDITION)["status"] == "False"
        wait_for(lambda: health(health_sock).get("2") == "healthy", timeout=10, what="GPU 2 healthy again")
        # The Event for the untaint is posted after the node patch that removed the taint: wait for it too.
        wait_for(lambda: {"GPUResidualVRAM", "GPUTainted", "GPUPurge", "GPUUntainted"}
                 <= {e["reason"] for e in api.events}, timeout=10,
                 what="Events for the residual, the taint, the purge and the untaint")
        assert all(e["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
                   for e in api.events)
        assert not [r for r in api.calls() if r.status == 403], "the agent needed a verb rbac.yaml does not grant"
        print(f"\nleak->condition {t_condition:.2f}s, leak->taint {t_taint:.2f}s (grace {GRACE:g}s)")
    finally:
        code = agent.stop(timeout=20) if agent is not None else None
        if agent is not None:
            print(agent.log_text()[-3000:])
        if tenant is not None and tenant.poll() is None:
            tenant.kill()
            tenant.wait()
        cg.remove()
        pr.stop()
        api.stop()
    assert code == 0
    assert not os.path.exists(health_sock)
