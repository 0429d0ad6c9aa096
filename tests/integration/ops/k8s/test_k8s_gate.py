"""The gpu-check gate end to end: the real HTTP listener, the init container's client (and the CLI that runs it),
tokens verified by TokenReview at the API-server stand-in, the pod's GPUs from the pod-resources stand-in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.k8s import NODE, GiB, api, snapshot  # noqa: F401  (api is a fixture)
from helpers.k8s_dra import rig  # noqa: F401  (a fixture)
from gpuwarden.ops.k8s.gate import POD_NAME, POD_UID, NODE_NAME, Gate, TokenVerifier
from gpuwarden.ops.k8s.gateclient import ask

AUDIENCE = "gpuwarden"


def pod_token(api, token: str, namespace: str, pod: str, node: str = NODE, audiences=(AUDIENCE,)) -> None:
    """A bound service-account token as the API server's TokenReview describes it (user.extra names the pod)."""
    api.tokens[token] = ({"username": f"system:serviceaccount:{namespace}:default", "uid": "u-1",
                          "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                          "extra": {POD_NAME: [pod], POD_UID: [f"uid-{pod}"], NODE_NAME: [node]}}, list(audiences))


@pytest.fixture
def gated(api, rig, tmp_path):  # noqa: F811
    r = rig()
    r.kubelet.assign("team-a", "trainer-0", "main", "amd.com/gpu", ["0000:12:00.0"])
    r.sample()
    gate = Gate("127.0.0.1:0", TokenVerifier(api.kube(), NODE, AUDIENCE), r.node.judge)
    gate.start()
    host, port = gate.address

    def asker(token: str | None):
        path = tmp_path / "token"
        if token is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(token + "\n")
        return ask(f"http://{host}:{port}", str(path), timeout_s=5)
    yield r, gate, asker
    gate.stop()


def test_a_pod_on_clean_gpus_passes_and_one_on_a_dirty_gpu_fails_with_one_line(api, gated):
    r, gate, asker = gated
    pod_token(api, "tok-a", "team-a", "trainer-0")
    code, line = asker("tok-a")
    assert (code, line) == (0, "gpu-check: pod team-a/trainer-0: GPU 2 clean")
    r.sample(snapshot({2: 14 * GiB}))
    code, line = asker("tok-a")
    assert code == 1 and "\n" not in line
    assert line.startswith("gpu-check: pod team-a/trainer-0: not fit for a new tenant: GPU 2: 14.0 GiB of residual")
    assert gate.answered == 2


def test_the_pods_gpus_come_from_the_kubelet_not_from_the_caller(api, gated):
    r, _, asker = gated
    pod_token(api, "tok-b", "team-b", "no-gpus")
    code, line = asker("tok-b")
    assert code == 1 and "the kubelet lists no GPU" in line and "team-b/no-gpus" in line


@pytest.mark.parametrize("case, want", [
    ("wrong audience", "token refused: token audiences do not match"),
    ("unknown", "token refused: invalid bearer token"),
    ("other node", "runs on node gpu-node-9, not gpu-node-1"),
    ("not a pod", "is not a pod's bound service-account token"),
])
def test_tokens_that_do_not_prove_a_pod_of_this_node_are_refused(api, gated, case, want):
    _, _, asker = gated
    if case == "wrong audience":
        pod_token(api, "t", "team-a", "trainer-0", audiences=("https://kubernetes.default.svc",))
    elif case == "other node":
        pod_token(api, "t", "team-a", "trainer-0", node="gpu-node-9")
    elif case == "not a pod":
        api.tokens["t"] = ({"username": "alice", "groups": ["devs"]}, [AUDIENCE])
    code, line = asker("t")
    assert code == 1 and want in line, line


def test_no_token_and_no_agent_say_what_to_do(api, gated, tmp_path):
    _, gate, asker = gated
    code, line = asker(None)
    assert code == 2 and "cannot read the token" in line and "gpuwarden-token" in line
    host, port = gate.address
    gate.stop()
    (tmp_path / "t2").write_text("x")
    code, line = ask(f"http://{host}:{port}", str(tmp_path / "t2"), timeout_s=2)
    assert code == 2 and "no answer from the node's agent" in line


def test_a_verified_token_is_reviewed_once_while_the_init_container_retries(api, gated):
    _, _, asker = gated
    pod_token(api, "tok-c", "team-a", "trainer-0")
    for _ in range(3):
        assert asker("tok-c")[0] == 0
    assert len([c for c in api.calls() if c.resource == "tokenreviews"]) == 1


def test_the_cli_runs_the_gate_client_with_one_line_and_its_exit_code(api, gated, tmp_path):
    _, gate, _ = gated
    pod_token(api, "tok-d", "team-a", "trainer-0")
    (tmp_path / "tok").write_text("tok-d")
    host, port = gate.address
    done = subprocess.run([sys.executable, "-m", "gpuwarden", "--state-dir", str(tmp_path / "none"), "gpu-check",
                           "--gate-url", f"http://{host}:{port}", "--token-file", str(tmp_path / "tok")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "gpu-check: pod team-a/trainer-0: GPU 2 clean"


def test_a_flood_of_bad_tokens_costs_the_api_server_a_bounded_number_of_reviews(api, gated):
    """Any pod can reach the port: made-up tokens must not turn into one TokenReview each (the clock stands
    still, so the whole flood falls in one second's budget)."""
    _, gate, _ = gated
    gate.verifier = TokenVerifier(api.kube(), NODE, AUDIENCE, clock=lambda: 1000.0)
    codes = [gate.answer(f"Bearer junk-{i}")[0] for i in range(60)]
    assert set(codes) == {401, 429} and codes.count(401) == 20
    assert gate.answer("Bearer junk-0") == (401, {"ok": False, "reason": gate.answer("Bearer junk-0")[1]["reason"]})
    assert len([c for c in api.calls() if c.resource == "tokenreviews"]) == 20  # the refusal was remembered
