"""How gpuwarden reaches the Kubernetes API (ops/k8s/kube.py on lightkube): in-cluster service account over
TLS, kubeconfig files (one, or a KUBECONFIG list merged), deadlines, and the one-line errors of each failure."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers.cli import gpuwarden
from helpers.k8s import NODE, api  # noqa: F401  (api is a fixture)
from standins.kube_apiserver import FakeApiServer, kubeconfig_for

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.k8s import kube as kube_mod
from gpuwarden.ops.k8s.kube import Conflict, Forbidden, KubeError, NotFoundError, connect


@pytest.fixture
def tls(tmp_path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (the service account's ca.crt is this certificate)."""
    cert, key = tmp_path / "apiserver.crt", tmp_path / "apiserver.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=kube-apiserver",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_in_cluster_the_service_account_token_and_ca_reach_the_api_over_tls(tls, tmp_path, monkeypatch):
    api = FakeApiServer(tls=tls, token="sa-token").start()
    try:
        api.add_node(NODE)
        account = tmp_path / "serviceaccount"
        account.mkdir()
        (account / "token").write_text("sa-token\n")  # the kubelet's file ends with no newline; either works
        (account / "ca.crt").write_bytes(Path(tls[0]).read_bytes())
        (account / "namespace").write_text("gpuwarden")
        monkeypatch.setattr(kube_mod, "SERVICE_ACCOUNT", account)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.httpd.server_address[1]))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "not-read"))
        kube = connect()
        assert kube.host == f"https://127.0.0.1:{api.httpd.server_address[1]}"
        assert kube.node(NODE)["metadata"]["name"] == NODE
        assert [r.status for r in api.calls()] == [200]

        (account / "token").write_text("revoked")  # a wrong token is the API's 401, one line
        fresh = connect()
        with pytest.raises(KubeError) as err:
            fresh.node(NODE)
        assert err.value.status == 401 and "Kubernetes refused to get node gpu-node-1 (401 Unauthorized)" in str(err.value)

        (account / "ca.crt").write_text("")  # no CA: refused before any request, naming the file
        with pytest.raises(GpuwardenError) as err:
            connect()
        assert f"no Kubernetes credentials: {account / 'ca.crt'} is missing or empty" in err.value.message
        monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
        with pytest.raises(GpuwardenError, match="KUBERNETES_SERVICE_PORT is not"):
            connect()
    finally:
        api.stop()


def test_a_kubeconfig_list_merges_as_kubectl_does(tmp_path, monkeypatch):
    api = FakeApiServer(token="t1").start()
    try:
        api.add_node(NODE)
        first = tmp_path / "a.yaml"  # sets the context and names the user; the second file defines both
        first.write_text(json.dumps({"current-context": "work", "users": [{"name": "me", "user": {"token": "t1"}}],
                                     "clusters": [], "contexts": [{"name": "work",
                                                                  "context": {"cluster": "c", "user": "me"}}]}))
        second = tmp_path / "b.yaml"
        second.write_text(json.dumps({"current-context": "other",
                                      "users": [{"name": "me", "user": {"token": "not-this-one"}}],
                                      "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                                      "contexts": [{"name": "other", "context": {"cluster": "c", "user": "me"}}]}))
        missing = tmp_path / "gone.yaml"
        monkeypatch.setenv("KUBECONFIG", f"{missing}:{first}:{second}")
        assert connect().node(NODE)["metadata"]["name"] == NODE
        assert connect(str(second)).host == api.url  # --config's kubeconfig: that file alone
        with pytest.raises(KubeError, match="401"):
            connect(str(second)).node(NODE)
    finally:
        api.stop()


def test_no_kubeconfig_is_one_line_naming_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    with pytest.raises(GpuwardenError) as err:
        connect()
    assert err.value.message == f"no Kubernetes credentials: no kubeconfig file at {tmp_path / 'none'}"
    assert "KUBECONFIG" in (err.value.hint or "")
    broken = tmp_path / "broken"
    broken.write_text(json.dumps({"current-context": "x", "clusters": [], "contexts": []}))
    with pytest.raises(GpuwardenError, match="no Kubernetes credentials: Context 'x' not found"):
        connect(str(broken))
    broken.write_text(json.dumps({"current-context": "x", "clusters": [], "contexts": [
        {"name": "x", "context": {"cluster": "nowhere"}}]}))
    with pytest.raises(GpuwardenError, match="no Kubernetes credentials: the kubeconfig lacks 'nowhere'"):
        connect(str(broken))
    broken.write_text("clusters: [unclosed\n")
    with pytest.raises(GpuwardenError) as err:
        connect(str(broken))
    assert err.value.message == f"no Kubernetes credentials: {broken} is not valid YAML at line 2: expected ',' or ']', " \
                                "but got '<stream end>'"


def test_the_cli_says_no_credentials_and_unreachable_in_one_line(state_dir, tmp_path):
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "init", "--gpus", "2", check=True)
    config = tmp_path / "node.toml"
    config.write_text(f'[kubernetes]\nnode_name = "{NODE}"\n')
    env = {"KUBECONFIG": str(tmp_path / "absent"), "GPUWARDEN_BACKEND": "sim"}
    out = gpuwarden("--state-dir", str(state_dir), "--config", str(config), "agent", "--kubernetes", "--foreground",
                    env=env, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines()[0] == f"gpuwarden: error: no Kubernetes credentials: no kubeconfig file at " \
                                         f"{tmp_path / 'absent'}", out.stderr
    assert out.stderr.splitlines()[1].strip() == "hint: run in the DaemonSet (service account), or set KUBECONFIG " \
                                                 "to a kubeconfig file"
    assert "Traceback" not in out.stderr

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connection refused
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(json.dumps(kubeconfig_for(f"http://127.0.0.1:{port}")))
    out = gpuwarden("--state-dir", str(state_dir), "--config", str(config), "drain", "1", "--kubernetes", "--yes",
                    env={**env, "KUBECONFIG": str(dead)})
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert f"cannot reach the Kubernetes API at http://127.0.0.1:{port} to " in out.stdout + out.stderr


def test_a_server_that_never_answers_is_a_deadline_not_a_hang():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections (the kernel does) and never answers a byte
    try:
        conf = kubeconfig_for(f"http://127.0.0.1:{listener.getsockname()[1]}")
        kube = kube_mod.connect_config(conf, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(KubeError) as err:
            kube.node(NODE)
        assert time.monotonic() - started < 5
        assert err.value.status is None and "cannot reach the Kubernetes API" in err.value.message
    finally:
        listener.close()


def test_refusals_map_to_the_same_errors_as_before(api):
    kube = api.kube()
    api.denied.add(("patch", "nodes"))
    with pytest.raises(Forbidden) as forbidden:
        kube.patch_node(NODE, {"metadata": {"labels": {"a": "b"}}})
    assert forbidden.value.status == 403 and "rbac.yaml" in (forbidden.value.hint or "")
    with pytest.raises(NotFoundError):
        kube.lease("gpuwarden", "nope")
    made = kube.create_lease("gpuwarden", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    with pytest.raises(Conflict) as conflict:
        kube.create_lease("gpuwarden", made)
    assert conflict.value.reason == "AlreadyExists"
    assert kube.calls == 4


def test_a_watch_closed_from_another_thread_ends_quietly(api):
    kube = api.kube()
    rv = kube.pods_on(NODE)["metadata"]["resourceVersion"]
    stream = kube.watch_pods(NODE, rv, 60)
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        for kind, obj in stream:
            seen.append(f"{kind} {obj['metadata']['name']}")
        done.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    api.add_pod("team-a", "p1", NODE)
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    stream.close()
    assert done.wait(10), "the reader did not wake when the watch was closed"
    assert seen == ["ADDED p1"]


def test_a_version_lightkube_models_lack_goes_as_a_generic_resource(api):
    from lightkube.generic_resource import GenericGlobalResource
    from lightkube.resources.resource_v1 import DeviceTaintRule
    kube = api.kube()
    assert kube.cluster_resource("resource.k8s.io/v1", "DeviceTaintRule", "devicetaintrules") is DeviceTaintRule
    assert issubclass(kube.cluster_resource("resource.k8s.io/v9", "DeviceTaintRule", "devicetaintrules"),
                      GenericGlobalResource)
    api.dra_versions = {"v9": {"devicetaintrules"}}
    rule = {"apiVersion": "resource.k8s.io/v9", "kind": "DeviceTaintRule", "metadata": {"name": "r1"},
            "spec": {"deviceSelector": {"driver": "gpu.amd.com", "pool": NODE, "device": "gpu-0"},
                     "taint": {"key": "gpuwarden.io/gpu-unclean", "value": "tenant-left", "effect": "NoSchedule"},
                     "futureField": {"kept": True}}}  # a field no model knows goes through as it is
    args = ("resource.k8s.io/v9", "DeviceTaintRule", "devicetaintrules")
    made = kube.create_cluster("create devicetaintrule r1", *args, rule)
    assert made["spec"]["futureField"] == {"kept": True}
    assert [r["metadata"]["name"] for r in kube.list_cluster("list devicetaintrules", *args)["items"]] == ["r1"]
    kube.delete_cluster("delete devicetaintrule r1", *args, "r1")
    assert api.rules() == []
    with pytest.raises(NotFoundError):
        kube.delete_cluster("delete devicetaintrule r1", *args, "r1")
    assert [(r.method, r.path) for r in api.calls()][-2:] == [("DELETE", "/apis/resource.k8s.io/v9/devicetaintrules/r1")] * 2


def test_a_lease_goes_back_as_it_came_with_fields_no_model_knows(api):
    # A read-modify-write must not drop what the server sent: the body is the API's JSON, never a model's copy.
    kube = api.kube()
    made = kube.create_lease("gpuwarden", {"metadata": {"name": "slot", "namespace": "gpuwarden",
                                                        "creationTimestamp": "2026-12-05T10:00:00Z",
                                                        "managedFields": [{"manager": "x", "operation": "Update",
                                                                           "time": "2026-12-05T10:00:00Z"}]},
                                           "spec": {"holderIdentity": "a", "futureField": {"kept": True}}})
    kube.update_lease("gpuwarden", {**made, "spec": {**made["spec"], "holderIdentity": "b"}})
    now = kube.lease("gpuwarden", "slot")
    assert now["spec"] == {"holderIdentity": "b", "futureField": {"kept": True}}
    assert now["metadata"]["managedFields"][0]["manager"] == "x"


def test_an_exec_credential_plugin_that_is_not_there_is_one_line(api, tmp_path):
    conf = api.kubeconfig()
    conf["users"] = [{"name": "agent", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                         "command": str(tmp_path / "no-such-plugin")}}}]
    kube = kube_mod.connect_config(conf)
    with pytest.raises(KubeError) as err:
        kube.node(NODE)
    assert err.value.message.startswith(f"no Kubernetes credentials to get node {NODE}: ") and err.value.status is None
    assert str(tmp_path / "no-such-plugin") in err.value.message
    assert api.calls() == []
