"""deploy/k8s against the Kubernetes API schema (kubernetes-validate, strict: unknown fields fail) and the
ServiceMonitor CRD's schema (vendored from prometheus-operator), plus what the agent relies on in them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import REPO
from k8s_helpers import cluster_role_rules
from gpuwarden.ops.k8s.health import DEFAULT_SOCKET as HEALTH_SOCKET
from gpuwarden.ops.k8s.nodesignal import TAINT_KEY
from gpuwarden.ops.k8s.podresources import DEFAULT_SOCKET as POD_RESOURCES_SOCKET

K8S_VERSION = "1.30.0"
DOCS = [(f.name, i, d) for f in sorted((REPO / "deploy/k8s").glob("*.yaml"))
        for i, d in enumerate(yaml.safe_load_all(f.read_text())) if d]
SM_SCHEMA = json.loads((Path(__file__).parent / "k8s_fixtures/servicemonitor.v1.schema.json").read_text())["schema"]


def by_kind(kind: str) -> dict:
    return next(d for _, _, d in DOCS if d["kind"] == kind)


@pytest.mark.parametrize("doc", [d for d in DOCS if d[2]["kind"] != "ServiceMonitor"],
                         ids=[f"{f}#{i}:{d['kind']}" for f, i, d in DOCS if d["kind"] != "ServiceMonitor"])
def test_core_objects_validate_strictly(doc):
    import kubernetes_validate
    kubernetes_validate.validate(doc[2], K8S_VERSION, strict=True)


def _pruned(obj, schema, where="") -> list[str]:
    """Fields a structural CRD schema would silently drop: a typo there is lost, not refused."""
    out = []
    if isinstance(obj, dict) and schema.get("type") == "object" and "properties" in schema:
        for k, v in obj.items():
            if k not in schema["properties"]:
                if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
                    out.append(f"{where}.{k}")
                continue
            out += _pruned(v, schema["properties"][k], f"{where}.{k}")
    elif isinstance(obj, list) and "items" in schema:
        for i, v in enumerate(obj):
            out += _pruned(v, schema["items"], f"{where}[{i}]")
    return out


def test_service_monitor_matches_the_crd_schema():
    sm = by_kind("ServiceMonitor")
    jsonschema.validate(sm, SM_SCHEMA)
    assert _pruned(sm["spec"], SM_SCHEMA["properties"]["spec"], "spec") == []
    svc = by_kind("Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_a_kubernetes_validate_failure_is_real():
    import kubernetes_validate
    bad = json.loads(json.dumps(by_kind("DaemonSet")))
    bad["spec"]["template"]["spec"]["hostPid"] = True  # the field is hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_daemonset_gives_the_agent_what_it_uses():
    ds = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["serviceAccountName"] == by_kind("ServiceAccount")["metadata"]["name"]
    assert any(t["key"] == TAINT_KEY and t.get("operator") == "Exists" for t in pod["tolerations"])
    (c,) = pod["containers"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUWARDEN_HOST_ROOT"]["value"] == "/host"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] and mounts["/host/sys"]["readOnly"] and "/dev" in mounts
    assert str(Path(POD_RESOURCES_SOCKET).parent) in mounts
    assert str(Path(HEALTH_SOCKET).parent) in mounts
    assert env["GPUWARDEN_STATE_DIR"]["value"] in mounts  # the agent socket gpu-check asks
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols[mounts["/host/proc"]["name"]]["hostPath"]["path"] == "/proc"
    assert vols[mounts["/host/sys"]["name"]]["hostPath"]["path"] == "/sys"
    cfg = by_kind("ConfigMap")["data"]["node.toml"]
    from gpuwarden.ops.config.kubernetes import parse
    import tomllib
    parse(tomllib.loads(cfg)["kubernetes"], lambda k, p, h: AssertionError(f"{k}: {p}"))


def test_the_daemonset_runs_the_agent_as_the_cli_parses_it_and_scrapes_where_it_listens():
    import typer

    from gpuwarden.ops.metrics.server import parse_listen
    from gpuwarden.playbooks.cli import build_app
    (c,) = by_kind("DaemonSet")["spec"]["template"]["spec"]["containers"]
    group = typer.main.get_command(build_app())
    ctx = group.make_context("gpuwarden", [])
    name, *rest = c["command"][1:]  # no global options: the environment sets them
    params = group.get_command(ctx, name).make_context(name, rest, parent=ctx).params  # unknown options fail here
    assert params["kubernetes"] and params["foreground"]
    port = parse_listen(params["metrics_listen"])[1]
    (cport,) = c["ports"]
    (sport,) = by_kind("Service")["spec"]["ports"]
    assert cport["containerPort"] == port and sport["targetPort"] == cport["name"] and sport["port"] == port


def test_the_cluster_role_grants_least_verbs():
    assert cluster_role_rules() == {("get", "nodes"), ("patch", "nodes"), ("patch", "nodes/status"),
                                    ("list", "pods"), ("watch", "pods"), ("create", "pods/eviction"),
                                    ("create", "events")}
    binding = by_kind("ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == by_kind("ServiceAccount")["metadata"]["name"]


def test_manifests_name_the_image_by_this_release_not_latest():
    from gpuwarden.ops import __version__
    images = [c["image"] for _, _, d in DOCS for c in _containers(d)]
    ours = [i for i in images if i.split(":")[0] == "gpuwarden"]
    assert ours and set(ours) == {f"gpuwarden:{__version__}"}, images


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec") or {}
    spec = (spec.get("template") or {}).get("spec") or spec
    return [*spec.get("initContainers", []), *spec.get("containers", [])]
