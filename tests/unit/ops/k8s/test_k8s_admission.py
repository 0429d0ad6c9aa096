"""deploy/k8s/admission: the MutatingAdmissionPolicy's CEL run on tenants' pods (cel-python, with the API
server's semantics in tests/helpers/cel_admission.py), the pods it makes validated as the API server would, and the
manifests validated offline against each Kubernetes release that serves MutatingAdmissionPolicy."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from helpers.cel_admission import Policy, as_admitted
from helpers.paths import REPO, TESTS

ADMISSION = REPO / "deploy/k8s/admission"
POLICY, BINDING = yaml.safe_load_all((ADMISSION / "cel/mutating-admission-policy.yaml").read_text())
PARAMS = yaml.safe_load((ADMISSION / "params/params.yaml").read_text())
PODS = {p["metadata"]["name"]: p for p in yaml.safe_load_all(
    (TESTS / "k8s_fixtures/admission_pods.yaml").read_text())}
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


def test_a_gpu_pod_gets_the_unprivileged_check_and_its_token_and_nothing_else(shipped):
    pod = shipped.admit(PODS["vllm-llama-70b"])
    (check,) = pod["spec"]["initContainers"]
    assert check["name"] == "gpu-check" and check["image"] == PARAMS["data"]["image"]
    assert check["command"] == ["gpuwarden", "gpu-check", "--gate-url", "http://$(HOST_IP):9836",
                                "--token-file", "/var/run/secrets/gpuwarden/token"]
    # The node's address from the downward API: the agent's hostPort answers there.
    assert check["env"] == [{"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    assert "limits" not in check["resources"] or not any("gpu" in k for k in check["resources"]["limits"])
    sc = check["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert check["volumeMounts"] == [{"name": "gpuwarden-token", "mountPath": "/var/run/secrets/gpuwarden",
                                      "readOnly": True}]
    vols = by_name(pod["spec"]["volumes"])
    (source,) = vols["gpuwarden-token"]["projected"]["sources"]
    assert source == {"serviceAccountToken": {"audience": PARAMS["data"]["tokenAudience"], "expirationSeconds": 600,
                                              "path": "token"}}
    assert vols["shm"] == PODS["vllm-llama-70b"]["spec"]["volumes"][0]  # the tenant's own stay as they were
    assert pod["spec"]["containers"] == as_admitted(PODS["vllm-llama-70b"])["spec"]["containers"]
    # Nothing else of the pod changes: no host namespace, no host path, no sidecar.
    before = as_admitted(PODS["vllm-llama-70b"])["spec"]
    assert set(pod["spec"]) - set(before) == {"initContainers"}


@pytest.mark.parametrize("flavour", ["cel", "kyverno"])
@pytest.mark.parametrize("name", sorted(PODS))
def test_no_policy_adds_privilege_to_any_pod(shipped, flavour, name):
    pod = shipped.admit(PODS[name]) if flavour == "cel" else kyverno().admit(as_admitted(PODS[name]))
    spec = pod["spec"]
    assert not any(spec.get(k) for k in ("hostPID", "hostNetwork", "hostIPC"))
    assert not [v for v in spec.get("volumes") or () if "hostPath" in v]
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        assert not sc.get("privileged") and not (sc.get("capabilities") or {}).get("add")
        assert not [p for p in c.get("ports") or () if p.get("hostPort")]


def test_the_check_runs_before_the_tenants_init(shipped):
    pod = shipped.admit(PODS["rlhf-0"])
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["gpu-check", "fetch-weights"]


def test_a_tenants_own_prestop_hook_is_never_touched(shipped):
    before = as_admitted(PODS["triton-0"])
    pod = shipped.admit(PODS["triton-0"])
    assert pod["spec"]["containers"] == before["spec"]["containers"]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["gpu-check"]


@pytest.mark.parametrize("name", ["web-0", "bench-0"])
def test_pods_without_gpus_or_that_opted_out_are_not_changed(shipped, name):
    assert shipped.patches(as_admitted(PODS[name])) in (None, [])
    assert shipped.admit(PODS[name]) == as_admitted(PODS[name])


def test_the_agents_namespace_and_kube_system_are_never_changed(shipped):
    pod = copy.deepcopy(PODS["vllm-llama-70b"])
    for ns in ("gpuwarden", "kube-system"):
        pod["metadata"]["namespace"] = ns
        assert shipped.patches(as_admitted(pod)) is None


def test_a_pod_that_already_has_the_check_like_the_tenant_example_is_left_alone(shipped):
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
    m["expression"] = m["expression"].replace("(variables.hasCheck ? [] :", "(false ? [] :")
    p = Policy(broken, BINDING, PARAMS)
    once = p.admit(PODS["vllm-llama-70b"])
    assert [c["name"] for c in p.admit(once)["spec"]["initContainers"]].count("gpu-check") == 2


def test_the_resource_names_and_the_gate_come_from_the_params():
    p = policy(gpuResources=" example.com/npu , nvidia.com/gpu", gatePort="19836")
    assert p.patches(as_admitted(PODS["vllm-llama-70b"])) == []  # amd.com/gpu is no longer a GPU here
    npu = copy.deepcopy(PODS["vllm-llama-70b"])
    npu["spec"]["containers"][0]["resources"] = {"limits": {"example.com/npu": 2}}
    check = p.admit(npu)["spec"]["initContainers"][0]
    assert check["name"] == "gpu-check" and "http://$(HOST_IP):19836" in check["command"]
    zero = copy.deepcopy(PODS["rlhf-0"])
    for c in zero["spec"]["containers"]:
        c["resources"]["limits"]["nvidia.com/gpu"] = 0
    assert p.patches(as_admitted(zero)) == []  # asking for no GPU is no GPU pod


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
    (check,) = pod["spec"]["initContainers"]
    name, *rest = check["command"][1:]
    params = group.get_command(ctx, name).make_context(name, rest, parent=ctx).params  # unknown options fail here
    assert params["gate_url"] == "http://$(HOST_IP):9836" and params["token_file"].endswith("/token")


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
    from helpers.kyverno_mutate import ClusterPolicy
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
    p["data"].update(gatePort="19836", tokenAudience="gw-test", gpuResources="nvidia.com/gpu")
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
