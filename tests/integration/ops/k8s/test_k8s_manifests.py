"""deploy/k8s as `kubectl kustomize` renders it (the base, the AMD and NVIDIA overlays with every combination of
the condition-policy and ServiceMonitor components, the admission and NPD bases), against the Kubernetes API
schema (kubernetes-validate, strict: unknown fields fail) and the ServiceMonitor CRD's schema (vendored from
prometheus-operator), plus what the agent relies on in them and what each overlay promises."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from helpers.k8s import cluster_role_rules
from helpers.kustomize_render import AGENT_VARIANTS, K8S, SHIPPED, by_kind, containers, render, render_error
from gpuwarden.ops import __version__
from gpuwarden.ops.k8s.health import DEFAULT_SOCKET as HEALTH_SOCKET
from gpuwarden.ops.k8s.nodesignal import TAINT_KEY
from gpuwarden.ops.k8s.podresources import DEFAULT_SOCKET as POD_RESOURCES_SOCKET
from helpers.paths import TESTS

K8S_VERSION = "1.30.0"
SM_SCHEMA = json.loads((TESTS / "k8s_fixtures/servicemonitor.v1.schema.json").read_text())["schema"]
# Kinds kubernetes-validate has no schema for: checked by their own tests (the ServiceMonitor here against its
# CRD; the admission policies in test_k8s_admission, under each Kubernetes version's and Kyverno's schemas).
FOREIGN = {"ServiceMonitor", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ClusterPolicy"}
GPU_RESOURCES = {"amd.com/gpu", "nvidia.com/gpu"}
_validated: set[str] = set()


def _agent(variant: str) -> tuple[dict, dict, dict]:
    """The rendered DaemonSet's pod spec, its agent container and its volumes by name."""
    pod = by_kind(render(variant), "DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return pod, c, {v["name"]: v for v in pod["volumes"]}


def _options(variant: str) -> set[str]:
    return set(variant.split("+")[1:])


@pytest.mark.parametrize("variant", sorted({*SHIPPED, *AGENT_VARIANTS}))
def test_every_rendered_object_validates_strictly(variant):
    import kubernetes_validate
    docs = render(variant)
    assert docs, variant
    for doc in docs:
        if doc["kind"] in FOREIGN:
            continue
        key = json.dumps(doc, sort_keys=True)
        if key not in _validated:  # the variants share most objects: each distinct one is validated once
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            _validated.add(key)


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


@pytest.mark.parametrize("variant", AGENT_VARIANTS)
def test_the_service_monitor_is_there_only_with_its_component_and_matches_the_crd(variant):
    docs = render(variant)
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    if "servicemonitor" not in _options(variant):
        assert monitors == [], variant  # a cluster without the Prometheus Operator applies it cleanly
        return
    (sm,) = monitors
    jsonschema.validate(sm, SM_SCHEMA)
    assert _pruned(sm["spec"], SM_SCHEMA["properties"]["spec"], "spec") == []
    svc = by_kind(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert sm["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]


def test_a_kubernetes_validate_failure_is_real():
    import kubernetes_validate
    bad = by_kind(render("overlays/amd"), "DaemonSet")
    bad["spec"]["template"]["spec"]["hostPid"] = True  # the field is hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


@pytest.mark.parametrize("variant", AGENT_VARIANTS)
def test_the_daemonset_gives_the_agent_what_it_uses(variant):
    docs = render(variant)
    pod, c, vols = _agent(variant)
    assert pod["hostPID"] is True and pod["serviceAccountName"] == by_kind(docs, "ServiceAccount")["metadata"]["name"]
    assert any(t["key"] == TAINT_KEY and t.get("operator") == "Exists" for t in pod["tolerations"])
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    # The agent watches every GPU of the node: it must not be given (and so take from tenants) any of them.
    assert not GPU_RESOURCES & {*c["resources"].get("requests", {}), *c["resources"].get("limits", {})}
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUWARDEN_HOST_ROOT"]["value"] == "/host"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] and mounts["/host/sys"]["readOnly"]
    assert str(Path(POD_RESOURCES_SOCKET).parent) in mounts
    assert env["GPUWARDEN_STATE_DIR"]["value"] in mounts  # the agent socket gpu-check asks
    assert vols[mounts["/host/proc"]["name"]]["hostPath"]["path"] == "/proc"
    assert vols[mounts["/host/sys"]["name"]]["hostPath"]["path"] == "/sys"
    assert {m["name"] for m in c["volumeMounts"]} == set(vols)  # nothing mounted that is not there, nor unused
    cfg = by_kind(docs, "ConfigMap")["data"]["node.toml"]
    from gpuwarden.ops.config.kubernetes import parse
    parse(tomllib.loads(cfg)["kubernetes"], lambda k, p, h: AssertionError(f"{k}: {p}"))


def _tolerated(pod: dict) -> set[str]:
    return {t["key"] for t in pod["tolerations"]}


def _node_terms(pod: dict) -> list[set[tuple[str, str]]]:
    """The nodes the agent goes to: each OR-ed affinity term as its (label, value) requirements."""
    assert "nodeSelector" not in pod, "a nodeSelector is AND-ed with the affinity: it would narrow every term"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    out = []
    for t in terms:
        assert all(e["operator"] == "In" for e in t["matchExpressions"]), t
        out.append({(e["key"], v) for e in t["matchExpressions"] for v in e["values"]})
    return out


def test_the_base_is_for_any_vendor_on_labelled_nodes():
    pod, c, vols = _agent("base")
    assert pod["nodeSelector"] == {"gpuwarden.io/agent": "true"} and "affinity" not in pod
    assert _tolerated(pod) >= GPU_RESOURCES | {TAINT_KEY}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert vols[mounts["/dev"]["name"]]["hostPath"]["path"] == "/dev"
    assert str(Path(HEALTH_SOCKET).parent) in mounts


@pytest.mark.parametrize("variant", [v for v in AGENT_VARIANTS if v.startswith("overlays/amd")])
def test_the_amd_overlay_mounts_amdgpus_devices_and_selects_amd_nodes(variant):
    pod, c, vols = _agent(variant)
    assert _tolerated(pod) == {TAINT_KEY, "amd.com/gpu"}
    assert _node_terms(pod) == [{("feature.node.kubernetes.io/amd-gpu", "true")}, {("gpuwarden.io/agent", "true")}]
    mounts = {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}
    assert "/dev" not in mounts
    assert mounts["/dev/kfd"]["hostPath"] == {"path": "/dev/kfd", "type": "CharDevice"}
    assert mounts["/dev/dri"]["hostPath"] == {"path": "/dev/dri", "type": "Directory"}
    assert mounts[str(Path(HEALTH_SOCKET).parent)]["hostPath"]["path"] == str(Path(HEALTH_SOCKET).parent)
    assert "runtimeClassName" not in pod and not {e["name"] for e in c["env"]} & {"NVIDIA_VISIBLE_DEVICES"}


@pytest.mark.parametrize("variant", [v for v in AGENT_VARIANTS if v.startswith("overlays/nvidia")])
def test_the_nvidia_overlay_takes_the_toolkits_devices_and_selects_nvidia_nodes(variant):
    pod, c, vols = _agent(variant)
    assert _tolerated(pod) == {TAINT_KEY, "nvidia.com/gpu"}
    assert _node_terms(pod) == [{("nvidia.com/gpu.present", "true")},
                                {("feature.node.kubernetes.io/pci-10de.present", "true")},
                                {("gpuwarden.io/agent", "true")}]
    # libnvidia-ml.so.1 and /dev/nvidia* come from the NVIDIA Container Toolkit: its runtime, every GPU,
    # the management library only
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    paths = {m["mountPath"] for m in c["volumeMounts"]}
    assert not {"/dev", "/dev/kfd", "/dev/dri", str(Path(HEALTH_SOCKET).parent)} & paths
    assert not {"dev", "amd-health"} & set(vols)


@pytest.mark.parametrize("variant", AGENT_VARIANTS)
def test_the_policy_is_the_taint_unless_the_condition_component_is_there(variant):
    cfg = by_kind(render(variant), "ConfigMap")["data"]["node.toml"]
    want = "condition" if "condition-policy" in _options(variant) else "taint"
    assert tomllib.loads(cfg)["kubernetes"]["policy"] == want
    # the component's copy of node.toml differs from the base's in that line only
    base = by_kind(render("base"), "ConfigMap")["data"]["node.toml"].splitlines()
    changed = [(a, b) for a, b in zip(base, cfg.splitlines(), strict=True) if a != b]
    assert [b.split("#")[0].strip() for _, b in changed] == ([] if want == "taint" else ['policy = "condition"'])


def test_the_daemonset_runs_the_agent_as_the_cli_parses_it_and_scrapes_where_it_listens():
    import typer

    from gpuwarden.ops.services.metrics_server import parse_listen
    from gpuwarden.playbooks.cli.root import build_app
    docs = render("overlays/amd+servicemonitor")
    (c,) = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    group = typer.main.get_command(build_app())
    ctx = group.make_context("gpuwarden", [])
    name, *rest = c["command"][1:]  # no global options: the environment sets them
    params = group.get_command(ctx, name).make_context(name, rest, parent=ctx).params  # unknown options fail here
    assert params["kubernetes"] and params["foreground"]
    port = parse_listen(params["metrics_listen"])[1]
    cport, gport = c["ports"]
    (sport,) = by_kind(docs, "Service")["spec"]["ports"]
    assert cport["containerPort"] == port and sport["targetPort"] == cport["name"] and sport["port"] == port
    # The gpu-check gate: on the host's address (tenants' init containers ask status.hostIP), where node.toml
    # listens, at the port the admission params name; metrics stay off the host port.
    gate = tomllib.loads(by_kind(docs, "ConfigMap")["data"]["node.toml"])["kubernetes"]["gate_listen"]
    assert gport["name"] == "gate" and gport["hostPort"] == gport["containerPort"] == int(gate.rpartition(":")[2])
    assert "hostPort" not in cport
    params = yaml.safe_load((K8S / "admission/params/params.yaml").read_text())
    assert params["data"]["gatePort"] == str(gport["hostPort"])


def test_the_cluster_role_grants_least_verbs():
    assert cluster_role_rules() == {("get", "nodes"), ("patch", "nodes"), ("patch", "nodes/status"),
                                    ("list", "pods"), ("watch", "pods"), ("create", "pods/eviction"),
                                    ("create", "events"),
                                    # the cluster-wide remediation limit (ops/k8s/remediationslots.py)
                                    ("get", "leases"), ("create", "leases"), ("update", "leases"),
                                    # DRA: the node's devices, and one DeviceTaintRule per device of a dirty GPU
                                    ("list", "resourceslices"), ("list", "devicetaintrules"),
                                    ("create", "devicetaintrules"), ("delete", "devicetaintrules"),
                                    # the gpu-check gate verifies a tenant pod's projected token
                                    ("create", "tokenreviews")}
    for variant in AGENT_VARIANTS:  # no overlay widens it
        docs = render(variant)
        rules = by_kind(docs, "ClusterRole")["rules"]
        assert {(v, r) for rule in rules for r in rule["resources"] for v in rule["verbs"]} == cluster_role_rules()
        assert [r["apiGroups"] for r in rules if r["resources"] == ["leases"]] == [["coordination.k8s.io"]]
        assert {g for r in rules if {"resourceslices", "devicetaintrules"} & set(r["resources"])
                for g in r["apiGroups"]} == {"resource.k8s.io"}
        assert [r["apiGroups"] for r in rules if r["resources"] == ["tokenreviews"]] == [["authentication.k8s.io"]]
        binding = by_kind(docs, "ClusterRoleBinding")
        assert binding["subjects"][0]["name"] == by_kind(docs, "ServiceAccount")["metadata"]["name"]


def test_every_image_of_every_rendering_is_this_release_not_latest():
    images = {v: [c["image"] for d in render(v) for c in containers(d)] for v in (*SHIPPED, *AGENT_VARIANTS)}
    ours = {i for found in images.values() for i in found if i.split(":")[0] == "gpuwarden"}
    assert ours == {f"gpuwarden:{__version__}"}, images
    assert all(images[v] for v in AGENT_VARIANTS)
    # the files themselves carry it too (the DaemonSet pasted alone is not :latest), and the admission params
    # name the image the policies inject
    raw = yaml.safe_load((K8S / "base/daemonset.yaml").read_text())
    assert [c["image"] for c in containers(raw)] == [f"gpuwarden:{__version__}"]
    for v in ("admission/cel", "admission/kyverno"):
        assert by_kind(render(v), "ConfigMap")["data"]["image"] == f"gpuwarden:{__version__}"
    tenant = yaml.safe_load((K8S / "tenant-example.yaml").read_text())
    assert {c["image"] for c in containers(tenant) if c["image"].startswith("gpuwarden")} == {f"gpuwarden:{__version__}"}


@pytest.mark.parametrize("flavour,kinds", [("cel", {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}),
                                           ("kyverno", {"ClusterPolicy"})])
def test_the_admission_bases_render_the_shipped_files_with_their_params(flavour, kinds):
    docs = render(f"admission/{flavour}")
    files = [d for f in sorted((K8S / "admission").glob("*/*.yaml")) if f.name != "kustomization.yaml"
             and f.parent.name in (flavour, "params") for d in yaml.safe_load_all(f.read_text()) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    # kustomize re-folds `>-` scalars that hold more-indented lines (an extra newline): whitespace only, which
    # CEL and JMESPath ignore; everything else must be the files' own
    assert _squeezed(sorted(docs, key=key)) == _squeezed(sorted(files, key=key))
    assert {d["kind"] for d in docs} == kinds | {"ConfigMap"}
    params = by_kind(docs, "ConfigMap")
    assert set(params["data"]["gpuResources"].split(",")) == GPU_RESOURCES


def _squeezed(obj):
    if isinstance(obj, str):
        return " ".join(obj.split())
    if isinstance(obj, list):
        return [_squeezed(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _squeezed(v) for k, v in obj.items()}
    return obj


def test_the_two_admission_flavours_cannot_be_applied_together():
    proc = render_error("admission/cel", "admission/kyverno")
    assert proc.returncode != 0 and "gpuwarden-admission" in proc.stderr, proc.stderr


def test_the_npd_base_is_the_monitor_config_as_a_configmap():
    (cm,) = render("npd")
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "gpuwarden-npd-monitor"  # no hash suffix
    assert json.loads(cm["data"]["gpuwarden-monitor.json"]) == json.loads((K8S / "npd/gpuwarden-monitor.json").read_text())


def test_the_readmes_own_overlay_renders_as_it_says(tmp_path):
    """The manual's Kubernetes page (docs/kubernetes.md): an overlay of the user's own beside deploy/ (NVIDIA, condition only, ServiceMonitor,
    their registry)."""
    import re
    import subprocess

    from helpers.paths import REPO
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", (REPO / "docs/kubernetes.md").read_text(),
                                  flags=re.S) if "my-cluster/kustomization.yaml" in b]
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster/kustomization.yaml").write_text(block)
    proc = subprocess.run(["kubectl", "kustomize", str(tmp_path / "my-cluster")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and by_kind(docs, "ServiceMonitor")
    assert tomllib.loads(by_kind(docs, "ConfigMap")["data"]["node.toml"])["kubernetes"]["policy"] == "condition"
    assert pod["containers"][0]["image"] == f"registry.example.com/gpuwarden:{__version__}"
