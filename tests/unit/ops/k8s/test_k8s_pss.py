"""A GPU pod that meets Pod Security's `restricted` profile still meets it after either admission policy ran
(tests/helpers/pss_restricted.py checks every control of the profile); the checker itself is shown to catch each one."""

from __future__ import annotations

import copy

import pytest
import yaml

from helpers.cel_admission import Policy, as_admitted
from helpers.paths import REPO
from helpers.kyverno_mutate import ClusterPolicy
from helpers.pss_restricted import violations

ADMISSION = REPO / "deploy/k8s/admission"
POLICY, BINDING = yaml.safe_load_all((ADMISSION / "cel/mutating-admission-policy.yaml").read_text())
PARAMS = yaml.safe_load((ADMISSION / "params/params.yaml").read_text())
KYVERNO = yaml.safe_load((ADMISSION / "kyverno/kyverno-clusterpolicy.yaml").read_text())
OLD_INJECTION = {"hostPID": True}  # what the policies used to add (issue 35): the checker must refuse it

RESTRICTED_GPU_POD = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm-0", "namespace": "team-r"},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "vllm", "image": "rocm/vllm:rocm6.3.1_vllm_0.8.5_20250521",
            "resources": {"limits": {"amd.com/gpu": 2}},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
        "volumes": [{"name": "cache", "emptyDir": {}}]}}


def admitted(flavour: str, pod: dict) -> dict:
    if flavour == "cel":
        return Policy(POLICY, BINDING, PARAMS).admit(pod)
    return ClusterPolicy(KYVERNO, {("gpuwarden", "gpuwarden-admission"): PARAMS}).admit(as_admitted(pod))


@pytest.mark.parametrize("flavour", ["cel", "kyverno"])
def test_a_restricted_gpu_pod_stays_restricted_after_the_policy(flavour):
    assert violations(RESTRICTED_GPU_POD) == []
    pod = admitted(flavour, RESTRICTED_GPU_POD)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["gpu-check"]  # the policy did act
    assert violations(pod) == []


@pytest.mark.parametrize("flavour", ["cel", "kyverno"])
def test_a_pod_restricted_only_per_container_stays_restricted_too(flavour):
    """No pod-level securityContext: the injected container must carry every setting itself."""
    pod = copy.deepcopy(RESTRICTED_GPU_POD)
    del pod["spec"]["securityContext"]
    pod["spec"]["containers"][0]["securityContext"].update(runAsNonRoot=True, seccompProfile={"type": "Localhost",
                                                                                             "localhostProfile": "p"})
    assert violations(pod) == []
    assert violations(admitted(flavour, pod)) == []


def test_the_tenant_example_meets_restricted_and_pins_its_images():
    import kubernetes_validate
    example = yaml.safe_load((REPO / "deploy/k8s/tenant-example.yaml").read_text())
    kubernetes_validate.validate(example, "1.36.0", strict=True)
    assert violations(example) == []
    for c in example["spec"]["initContainers"] + example["spec"]["containers"]:
        image = c["image"]
        assert "@sha256:" in image or (":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest")), image


BREAKS = {
    "hostProcess": lambda p: p["spec"]["securityContext"].update(windowsOptions={"hostProcess": True}),
    "host namespaces": lambda p: p["spec"].update(OLD_INJECTION),
    "hostNetwork": lambda p: p["spec"].update(hostNetwork=True),
    "hostIPC": lambda p: p["spec"].update(hostIPC=True),
    "privileged": lambda p: p["spec"]["containers"][0]["securityContext"].update(privileged=True),
    "capabilities add": lambda p: p["spec"]["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "capabilities drop": lambda p: p["spec"]["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
    "hostPath": lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/run/gpuwarden"}}),
    "host ports": lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]),
    "AppArmor": lambda p: p["spec"]["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
    "AppArmor annotation": lambda p: p["metadata"].update(annotations={
        "container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}),
    "SELinux": lambda p: p["spec"]["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
    "/proc mount": lambda p: p["spec"]["containers"][0]["securityContext"].update(procMount="Unmasked"),
    "seccomp": lambda p: p["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    "sysctls": lambda p: p["spec"]["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
    "volume types": lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}),
    "runAsNonRoot": lambda p: p["spec"]["securityContext"].update(runAsNonRoot=False),
    "runAsUser": lambda p: p["spec"]["containers"][0]["securityContext"].update(runAsUser=0),
    "allowPrivilegeEscalation": lambda p: p["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
}


@pytest.mark.parametrize("control", sorted(BREAKS))
def test_the_checker_catches_each_control(control):
    pod = copy.deepcopy(RESTRICTED_GPU_POD)
    BREAKS[control](pod)
    assert len(violations(pod)) >= 1, control


def test_the_old_injection_would_have_failed():
    """What the policies added before issue 35 (hostPID, a privileged sidecar, a hostPath volume) breaks three
    controls: the test above would have failed on them."""
    pod = copy.deepcopy(RESTRICTED_GPU_POD)
    pod["spec"]["hostPID"] = True
    pod["spec"]["volumes"].append({"name": "gpuwarden-state", "hostPath": {"path": "/run/gpuwarden"}})
    pod["spec"]["initContainers"] = [{"name": "post-clean", "image": "gpuwarden:0.3.0", "restartPolicy": "Always",
                                      "securityContext": {"privileged": True}}]
    found = " ".join(violations(pod))
    assert "hostPID" in found and "hostPath" in found and "privileged" in found
