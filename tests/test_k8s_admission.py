"""deploy/k8s/admission: the MutatingAdmissionPolicy's CEL run on tenants' pods (cel-python, with the API
server's semantics in tests/cel_admission.py), the pods it makes validated as the API server would, and the
manifests validated offline against each Kubernetes release that serves MutatingAdmissionPolicy."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from cel_admission import Policy, as_admitted
from conftest import REPO

ADMISSION = REPO / "deploy/k8s/admission"
POLICY, BINDING = yaml.safe_load_all((ADMISSION / "cel/mutating-admission-policy.yaml").read_text())
PARAMS = yaml.safe_load((ADMISSION / "params/params.yaml").read_text())
PODS = {p["metadata"]["name"]: p for p in yaml.safe_load_all(
    (Path(__file__).parent / "k8s_fixtures/admission_pods.yaml").read_text())}
TENANT_EXAMPLE = yaml.safe_load((REPO / "deploy/k8s/tenant-example.yaml").read_text())


def policy(**params: str) -> Policy:
    p = copy.deepcopy(PARAMS)
    p["data"].update(params)
    return Policy(POLICY, BINDING, p)


@pytest.fixture(scope="module")
def shipped() -> Policy:
    return Policy(POLICY, BINDING, PARAMS)


def by_name(items: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in items}


def test_a_gpu_pod_gets_the_check_with_its_own_gpus_and_the_post_clean_sidecar(shipped):
    pod = shipped.admit(PODS["vllm-llama-70b"])
    check, clean = pod["spec"]["initContainers"]
    assert check["name"] == "gpu-check" and check["command"] == ["gpuwarden", "gpu-check"]
    assert check["image"] == clean["image"] == PARAMS["data"]["image"]
    assert check["resources"]["limits"] == {"amd.com/gpu": "8"}  # the workload's 8: the kubelet reuses them
    assert check["volumeMounts"] == [{"name": "gpuwarden-state", "mountPath": "/run/gpuwarden", "readOnly": True}]
    assert {e["name"]: e["value"] for e in check["env"]}["GPUWARDEN_STATE_DIR"] == "/run/gpuwarden"
    assert clean["name"] == "post-clean" and clean["restartPolicy"] == "Always"  # a native sidecar: stops last
    assert clean["lifecycle"]["preStop"]["exec"]["command"][:2] == ["gpuwarden", "post-clean"]
    assert clean["securityContext"] == {"privileged": True} and pod["spec"]["hostPID"] is True
    vols = by_name(pod["spec"]["volumes"])
    assert vols["gpuwarden-state"]["hostPath"] == {"path": "/run/gpuwarden", "type": "Directory"}
    assert vols["shm"] == PODS["vllm-llama-70b"]["spec"]["volumes"][0]  # the tenant's own stay as they were
    assert pod["spec"]["containers"] == as_admitted(PODS["vllm-llama-70b"])["spec"]["containers"]


def test_the_check_asks_for_the_sum_of_the_containers_gpus_and_runs_before_the_tenants_init(shipped):
    pod = shipped.admit(PODS["rlhf-0"])
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ["gpu-check", "post-clean", "fetch-weights"]
    assert pod["spec"]["initContainers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "6"}


def test_a_tenants_own_prestop_hook_is_never_touched(shipped):
    before = as_admitted(PODS["triton-0"])
    pod = shipped.admit(PODS["triton-0"])
    assert pod["spec"]["containers"] == before["spec"]["containers"]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["gpu-check", "post-clean"]


@pytest.mark.parametrize("name", ["web-0", "bench-0"])
def test_pods_without_gpus_or_that_opted_out_are_not_changed(shipped, name):
    assert shipped.patches(as_admitted(PODS[name])) in (None, [])
    assert shipped.admit(PODS[name]) == as_admitted(PODS[name])


def test_the_agents_namespace_and_kube_system_are_never_changed(shipped):
    pod = copy.deepcopy(PODS["vllm-llama-70b"])
    for ns in ("gpuwarden", "kube-system"):
        pod["metadata"]["namespace"] = ns
        assert shipped.patches(as_admitted(pod)) is None


def test_a_pod_that_already_has_both_like_the_tenant_example_is_left_alone(shipped):
    assert shipped.patches(as_admitted(TENANT_EXAMPLE)) == []


@pytest.mark.parametrize("name", sorted(PODS))
def test_applied_twice_is_applied_once(shipped, name):
    once = shipped.admit(PODS[name])
    assert shipped.patches(once) in (None, [])
    assert shipped.admit(once) == once


def test_the_idempotence_check_can_fail():
    """Without the guard on an existing gpu-check the second pass adds another: the test above would see it."""
    broken = copy.deepcopy(POLICY)
    m = broken["spec"]["mutations"][0]["jsonPatch"]
    m["expression"] = m["expression"].replace("(variables.hasCheck ? [] : [", "(false ? [] : [")
    m["expression"] = m["expression"].replace("(variables.hasCheck && !variables.wantPostClean)", "false")
    p = Policy(broken, BINDING, PARAMS)
    once = p.admit(PODS["vllm-llama-70b"])
    assert [c["name"] for c in p.admit(once)["spec"]["initContainers"]].count("gpu-check") == 2


def test_post_clean_off_injects_the_check_alone():
    pod = policy(postClean="false").admit(PODS["vllm-llama-70b"])
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["gpu-check"]
    assert "hostPID" not in pod["spec"]


def test_the_resource_names_come_from_the_params():
    p = policy(gpuResources=" example.com/npu , nvidia.com/gpu")
    assert p.patches(as_admitted(PODS["vllm-llama-70b"])) == []  # amd.com/gpu is no longer a GPU here
    npu = copy.deepcopy(PODS["vllm-llama-70b"])
    npu["spec"]["containers"][0]["resources"] = {"limits": {"example.com/npu": 2}}
    assert p.admit(npu)["spec"]["initContainers"][0]["resources"]["limits"] == {"example.com/npu": "2"}


@pytest.mark.parametrize("name", ["vllm-llama-70b", "rlhf-0", "triton-0"])
def test_the_mutated_pods_are_valid_pods(shipped, name):
    import kubernetes_validate
    kubernetes_validate.validate(shipped.admit(PODS[name]), "1.36.0", strict=True)


def test_the_injected_commands_parse_as_the_cli_defines_them(shipped):
    import typer

    from gpuwarden.playbooks.cli.root import build_app
    group = typer.main.get_command(build_app())
    ctx = group.make_context("gpuwarden", [])
    pod = shipped.admit(PODS["vllm-llama-70b"])
    check, clean = pod["spec"]["initContainers"]
    for argv in (check["command"], clean["lifecycle"]["preStop"]["exec"]["command"]):
        name, *rest = argv[1:]
        group.get_command(ctx, name).make_context(name, rest, parent=ctx)  # an unknown option fails here


def test_the_image_is_this_release():
    from gpuwarden.ops import __version__
    assert PARAMS["data"]["image"] == f"gpuwarden:{__version__}"


# --- the manifests, offline ---------------------------------------------------------------------------
# MutatingAdmissionPolicy: v1alpha1 from 1.32 (alpha), v1beta1 from 1.34 (beta), v1 from 1.36 (GA).
SERVED = [("1.32.0", "v1alpha1"), ("1.34.0", "v1beta1"), ("1.36.0", "v1"), ("1.37.0", "v1")]


@pytest.mark.parametrize("k8s,version", SERVED, ids=[f"{k}-{v}" for k, v in SERVED])
def test_the_policy_and_binding_validate_where_they_are_served(k8s, version):
    import kubernetes_validate
    for doc in (POLICY, BINDING):
        doc = {**doc, "apiVersion": f"admissionregistration.k8s.io/{version}"}
        kubernetes_validate.validate(doc, k8s, strict=True)
    kubernetes_validate.validate(PARAMS, k8s, strict=True)


def test_the_shipped_version_is_ga_and_not_served_before_it_existed():
    import kubernetes_validate
    assert POLICY["apiVersion"] == BINDING["apiVersion"] == "admissionregistration.k8s.io/v1"
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(POLICY, "1.35.0", strict=True)  # 1.35 serves v1beta1 at most


def test_a_misspelt_field_fails_validation():
    import kubernetes_validate
    bad = json.loads(json.dumps(POLICY))
    bad["spec"]["mutations"][0]["jsonpatch"] = bad["spec"]["mutations"][0].pop("jsonPatch")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.36.0", strict=True)


# --- the Kyverno ClusterPolicy: the same pods out of the same pods ------------------------------------
KYVERNO = yaml.safe_load((ADMISSION / "kyverno/kyverno-clusterpolicy.yaml").read_text())


def kyverno(params: dict = PARAMS):
    from kyverno_mutate import ClusterPolicy
    return ClusterPolicy(KYVERNO, {(params["metadata"]["namespace"], params["metadata"]["name"]): params})


@pytest.mark.parametrize("name", sorted(PODS))
def test_kyverno_makes_the_same_pod_as_the_admission_policy(shipped, name):
    want = shipped.admit(PODS[name])
    got = kyverno().admit(as_admitted(PODS[name]))
    assert got == want
    assert kyverno().admit(got) == got  # and applied twice is applied once


def test_kyverno_leaves_the_tenant_example_and_the_agents_namespace_alone():
    assert kyverno().admit(as_admitted(TENANT_EXAMPLE)) == as_admitted(TENANT_EXAMPLE)
    pod = as_admitted(PODS["vllm-llama-70b"])
    pod["metadata"]["namespace"] = "gpuwarden"
    assert kyverno().admit(pod) == pod


def test_kyverno_takes_the_same_params():
    p = copy.deepcopy(PARAMS)
    p["data"].update(postClean="false", gpuResources="nvidia.com/gpu")
    assert kyverno(p).admit(as_admitted(PODS["rlhf-0"])) == policy(**p["data"]).admit(PODS["rlhf-0"])
    assert kyverno(p).admit(as_admitted(PODS["vllm-llama-70b"])) == as_admitted(PODS["vllm-llama-70b"])


def _pruned(given, kept, where="") -> list[str]:
    """Fields of `given` that the schema's model dropped: unknown to the CRD, so Kyverno would never see them."""
    if isinstance(given, dict):
        return [p for k, v in given.items()
                for p in ([f"{where}.{k}"] if k not in kept else _pruned(v, kept[k], f"{where}.{k}"))]
    if isinstance(given, list):
        return [p for i, (a, b) in enumerate(zip(given, kept)) for p in _pruned(a, b, f"{where}[{i}]")]
    return [] if given == kept else [f"{where} (changed)"]


def _kyverno_schema_check(doc: dict) -> list[str]:
    # Kyverno's CRD openAPIV3 schema as generated models (cloudcoil-models-kyverno, Kyverno 1.13's CRDs).
    from cloudcoil.models.kyverno.v1 import ClusterPolicy
    model = ClusterPolicy.model_validate(doc)
    return _pruned(doc, model.model_dump(by_alias=True, exclude_unset=True, mode="json"))


def test_the_kyverno_policy_fits_kyvernos_crd_schema():
    assert _kyverno_schema_check(KYVERNO) == []


def test_a_misspelt_kyverno_field_is_caught():
    import pydantic
    bad = copy.deepcopy(KYVERNO)
    bad["spec"]["rules"][0]["mutate"]["patchesJSON6902"] = bad["spec"]["rules"][0]["mutate"].pop("patchesJson6902")
    assert _kyverno_schema_check(bad) == [".spec.rules[0].mutate.patchesJSON6902"]
    bad = copy.deepcopy(KYVERNO)
    bad["spec"]["rules"][0]["match"]["any"][0]["resources"]["kinds"] = "Pod"  # a list in the schema
    with pytest.raises(pydantic.ValidationError):
        _kyverno_schema_check(bad)
