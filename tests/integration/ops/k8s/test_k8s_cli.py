"""The Kubernetes commands as an operator runs them: drain/undrain --kubernetes (evictions, PDB, cordon),
gpu-check, post-clean, the [kubernetes] config table, host roots, and pods in `status`."""

from __future__ import annotations

import json
import signal

import pytest

from helpers.cli import gpuwarden
from helpers.k8s import NODE, PodCgroup
from helpers.journal import read_journal
from gpuwarden.ops.foundation.jsondoc import validate
from helpers.simnode import start_tenant
from standins.kube_apiserver import FakeApiServer
from standins.podresources_server import PodResourcesServer

UID = "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"
CID = "ab" * 32


@pytest.fixture
def k8s_node(state_dir, tmp_path):
    """A sim node of 2 GPUs, an API stand-in with this node, a pod-resources socket, and the CLI wired to them."""
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "init", "--gpus", "2", check=True)
    api = FakeApiServer().start()
    api.add_node(NODE)
    pr = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    config = tmp_path / "node.toml"
    config.write_text(f'[kubernetes]\nnode_name = "{NODE}"\npod_resources_socket = "{tmp_path / "kubelet.sock"}"\n')
    env = {"KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")), "GPUWARDEN_BACKEND": "sim"}

    def cli(*args, **kw):
        return gpuwarden("--state-dir", str(state_dir), "--config", str(config), *args, env=env, **kw)
    yield api, pr, cli
    pr.stop()
    api.stop()


def test_drain_evicts_through_the_eviction_api_respecting_the_pdb(k8s_node, state_dir):
    api, pr, cli = k8s_node
    tenant = start_tenant(state_dir, 1, "2GiB")
    try:
        api.add_pod("team-a", "trainer-1", NODE, uid=UID, labels={"app": "trainer"},
                    containers={"main": f"containerd://{CID}"})
        pr.assign("team-a", "trainer-1", "main", "amd.com/gpu", ["0000:11:00.0"])
        api.add_pdb("team-a", "trainer-pdb", {"app": "trainer"}, disruptions_allowed=0)
        api.on_delete.append(lambda ns, name: (tenant.kill(), tenant.wait()))

        plan = cli("drain", "1", "--kubernetes", "--dry-run")
        assert plan.returncode == 0, plan.stderr
        assert "team-a/trainer-1 (assigned by the kubelet)" in plan.stdout and "cordon node" in plan.stdout
        assert not [r for r in api.calls() if r.verb in ("create", "patch")]

        blocked = cli("drain", "1", "--kubernetes", "--eviction-timeout", "0", "--yes")
        assert blocked.returncode == 1
        assert "disruption budget" in (blocked.stdout + blocked.stderr)
        assert api.pods.get(("team-a", "trainer-1")) is not None
        assert [r.status for r in api.calls() if r.resource == "pods/eviction"][-1] == 429

        api.set_pdb("trainer-pdb", 1)
        done = cli("drain", "1", "--kubernetes", "--grace", "0", "--yes", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        events = [json.loads(line) for line in done.stdout.splitlines()]
        assert any(e["kind"] == "step_ok" and e["step"] == "evict" for e in events)
        assert ("team-a", "trainer-1") not in api.pods
        assert api.node(NODE)["spec"]["unschedulable"] is True

        undrain = cli("undrain", "1", "--kubernetes")
        assert undrain.returncode == 0, undrain.stdout + undrain.stderr
        node = api.node(NODE)
        assert not node["spec"].get("unschedulable")
        assert "gpuwarden.io/cordoned-by" not in (node["metadata"].get("annotations") or {})
    finally:
        if tenant.poll() is None:
            tenant.kill()
            tenant.wait()


def test_undrain_lifts_no_cordon_it_did_not_set():
    from gpuwarden.ops.k8s.evict import cordon, uncordon_if_ours
    api = FakeApiServer().start()
    try:
        api.add_node(NODE)
        kube = api.kube()
        api.edit_node(NODE, lambda n: n["spec"].update(unschedulable=True))  # an administrator's cordon
        assert cordon(kube, NODE) is False  # already cordoned: not ours
        assert "not cordoned by gpuwarden" in uncordon_if_ours(kube, NODE)
        assert api.node(NODE)["spec"]["unschedulable"] is True
        api.edit_node(NODE, lambda n: n["spec"].pop("unschedulable"))
        api.conflict_next = 1  # someone writes the node between our read and our patch: read again, retry
        assert cordon(kube, NODE) is True
        assert "uncordoned" in uncordon_if_ours(kube, NODE)
        assert not api.node(NODE)["spec"].get("unschedulable")
    finally:
        api.stop()


def test_gpu_check_json_and_exit_codes_without_an_agent(state_dir, cli):
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "init", "--gpus", "2", check=True)
    env = {"GPUWARDEN_BACKEND": "sim"}
    ok = cli("gpu-check", "--json", env={**env, "ROCR_VISIBLE_DEVICES": "1"})
    doc = json.loads(ok.stdout)
    validate(doc)
    assert ok.returncode == 0 and doc["source"] == "sampled here" and doc["chosen_by"] == "ROCR_VISIBLE_DEVICES"
    assert [g["gpu"] for g in doc["gpus"]] == [1]
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "leak", "--gpu", "1", "--size", "3GiB",
              check=True)
    bad = cli("gpu-check", "--json", env=env)
    doc = json.loads(bad.stdout)
    validate(doc)
    assert bad.returncode == 1 and doc["ok"] is False
    assert [g["ok"] for g in doc["gpus"]] == [True, False] and "residual" in doc["gpus"][1]["reasons"][0]
    missing = cli("gpu-check", "7", env=env)
    assert missing.returncode == 2 and "no GPU 7" in missing.stderr


def test_post_clean_waits_for_the_pods_processes_then_purges(state_dir, cli):
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "init", "--gpus", "2", check=True)
    cg = PodCgroup(UID, CID)
    if not cg.usable:
        pytest.skip("cannot create a kubepods cgroup here (needs root and a writable v1 pids hierarchy)")
    tenant = start_tenant(state_dir, 0, "1GiB")
    import subprocess
    import sys
    from helpers.paths import REPO
    try:
        assert cg.add(tenant.pid)
        hook = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir), "--backend", "sim",
                                 "post-clean", "0", "--pod-uid", UID, "--timeout", "30"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # It waits while the pod's process still runs on the GPU...
        first = _line_within(hook.stderr, 30)
        assert f"waiting for pid {tenant.pid}" in first and hook.poll() is None
        tenant.send_signal(signal.SIGTERM)
        tenant.wait()
        out, err = hook.communicate(timeout=60)
        assert hook.returncode == 0, out + err
        assert "purge GPU 0" in out
    finally:
        if tenant.poll() is None:
            tenant.kill()
            tenant.wait()
        cg.remove()
    journal = read_journal(state_dir)
    assert any(e["action"] == "purge" and e["result"] == "ok" for e in journal)


def _line_within(stream, timeout: float) -> str:
    """The next line of a child's pipe, or AssertionError after `timeout` seconds."""
    import select
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no line within {timeout}s"
    return stream.readline()


def test_post_clean_outside_a_pod_says_what_to_do(state_dir, cli, tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/user.slice/user-0.slice/session-1.scope\n")
    out = cli("--proc-root", str(proc), "post-clean", env={"GPUWARDEN_BACKEND": "sim"})
    assert out.returncode == 2
    assert "not in a pod's cgroup" in out.stderr and "--pod-uid" in out.stderr


def test_kubernetes_config_errors_name_the_line(tmp_path):
    from gpuwarden.ops.foundation.errors import ConfigError
    from gpuwarden.ops.config.nodeconfig import parse
    path = tmp_path / "node.toml"
    with pytest.raises(ConfigError) as err:
        parse('[kubernetes]\npolicy = "taint"\ntaint_after = "soon"\n', path)
    assert err.value.message == f"{path}:3: kubernetes.taint_after: cannot read duration 'soon'"
    with pytest.raises(ConfigError, match="kubernetes.plicy: unknown key"):
        parse('[kubernetes]\nplicy = "taint"\n', path)
    cfg = parse('[kubernetes]\ntaint_after = "90s"\nhealth = true\n', path).kubernetes
    assert (cfg.taint_after, cfg.health, cfg.policy) == (90.0, True, "taint")


def test_host_roots_are_the_live_node_not_a_captured_tree(tmp_path, monkeypatch):
    from gpuwarden.ops.node.backends.select import open_backend
    from gpuwarden.ops.foundation.errors import BackendUnavailable
    from gpuwarden.ops.foundation.settings import Settings
    host = tmp_path / "host"
    (host / "sys").mkdir(parents=True)
    (host / "proc").symlink_to("/proc")
    monkeypatch.setenv("GPUWARDEN_HOST_ROOT", str(host))
    s = Settings.from_env(state_dir=tmp_path / "state")
    assert (s.sysfs_root, s.proc_root, s.live, s.captured) == (host / "sys", host / "proc", True, False)
    # Live: every real backend is tried (amdsmi and nvml too, not the captured tree's sysfs alone); with none,
    # the error names each, and no command falls back to the simulated node (ops/node/backends/select.py).
    with pytest.raises(BackendUnavailable) as live:
        open_backend(s)
    assert "amdsmi:" in live.value.message and "nvml:" in live.value.message
    monkeypatch.delenv("GPUWARDEN_HOST_ROOT")
    captured = Settings.from_env(state_dir=tmp_path / "state", sysfs_root=host / "sys")
    assert captured.captured
    with pytest.raises(BackendUnavailable) as tree:
        open_backend(captured)
    assert "amdsmi:" not in tree.value.message and "sysfs:" in tree.value.message


def test_status_names_pods_on_processes_holders_and_the_last_tenant():
    from gpuwarden.ops.foundation.model import GpuProcess, Holder, PodGpus
    from gpuwarden.playbooks.cli.status_text import render
    from helpers.k8s import snapshot
    import dataclasses
    h = Holder(pid=77, start_time=1.0, reason="zombie", gpus=(0,), vram_bytes=1 << 30, namespace="team-a",
               pod="trainer-0", container_name="main", pod_deleted_at=820.0)
    snap = snapshot({0: 1 << 30, 1: 4 << 30}, {0: [h]})
    snap = dataclasses.replace(
        snap, taken_at=1000.0,
        processes=(GpuProcess(pid=77, start_time=1.0, user="u", command="python train.py", state="zombie",
                              vram={0: 1 << 30}, namespace="team-a", pod="trainer-0", container_name="main"),),
        pods=(PodGpus("team-b", "infer-3", "server", (1,), deleted_at=700.0),),
        kubernetes={"node": "gpu-node-1", "policy": "taint", "taint": "residual-vram", "problem": None,
                    "condition": {"type": "GPUResidualVRAM", "status": "True", "reason": "ResidualVRAM"}})
    text = render(snap)
    assert ("kubernetes: node gpu-node-1 (policy taint): condition GPUResidualVRAM=True (ResidualVRAM), tainted "
            "gpuwarden.io/gpu-unhealthy=residual-vram:NoSchedule") in text
    assert "pod team-a/trainer-0 (container main)" in text
    assert "zombie of pod team-a/trainer-0 (container main), deleted 3 min ago" in text
    assert "GPU 1 was last given to pod team-b/infer-3 (container server), deleted 5 min ago" in text


def test_kubernetes_options_are_checked_before_the_agent_starts(cli):
    out = cli("agent", "--foreground", "--node-name", "n1", env={"GPUWARDEN_BACKEND": "sim"})
    assert out.returncode == 2 and "--node-name is an option of Kubernetes mode" in out.stderr
    out = cli("k8s-agent", "--k8s-policy", "sometimes", env={"GPUWARDEN_BACKEND": "sim"})
    assert out.returncode == 2 and "unknown --k8s-policy 'sometimes'" in out.stderr
