"""deploy/k8s/npd: node-problem-detector's custom plugin (`gpuwarden gpu-check --node`, run as a real process
on the sim node) and the agent's reconciler writing the same GPUResidualVRAM condition on the API-server
stand-in: same status and reason at every step, and no flapping while both keep writing.

NPD cannot run here; NpdMonitor does what its custom plugin monitor does for a permanent rule
(pkg/custompluginmonitor: exit 0/1/2 -> False/True/Unknown, the rule's reason while True and the default
condition's reason and message otherwise, the message taken only on a transition, stdout cut at
max_output_length), and patches the node's status as its Kubernetes exporter does."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.cli import gpuwarden
from helpers.k8s import NODE, Clock, api  # noqa: F401  (api: the stand-in fixture)
from gpuwarden.ops.k8s.nodesignal import CONDITION, NodeSignal

CONFIG = json.loads((REPO / "deploy/k8s/npd/gpuwarden-monitor.json").read_text())
BIN = Path(sys.executable).parent / "gpuwarden"


class NpdMonitor:
    def __init__(self, config: dict, kube, node: str, global_args: list[str], extra_args: list[str]):
        (self.rule,) = config["rules"]
        self.default = next(c for c in config["conditions"] if c["type"] == self.rule["condition"])
        self.max_output = config["pluginConfig"]["max_output_length"]
        self.kube, self.node, self.global_args, self.extra_args = kube, node, global_args, extra_args
        self.condition = {"type": self.default["type"], "status": "False", "reason": self.default["reason"],
                          "message": self.default["message"], "lastTransitionTime": _now()}
        self.outputs: list[tuple[int, str]] = []

    def run_once(self) -> dict:
        timeout = float(self.rule["timeout"].rstrip("s"))
        # The rule's path is where the image puts gpuwarden; here it is this venv's (same args).
        done = subprocess.run([str(BIN), *self.global_args, *self.rule["args"], *self.extra_args],
                              capture_output=True, text=True,
                              timeout=timeout)
        out = done.stdout.strip()[:self.max_output]
        self.outputs.append((done.returncode, done.stdout))
        status = {0: "False", 1: "True"}.get(done.returncode, "Unknown")
        old = self.condition
        if status == "True":
            new = {**old, "status": "True", "reason": self.rule["reason"]}
            if old["status"] != "True" or old["reason"] != self.rule["reason"]:
                new.update(message=out, lastTransitionTime=_now())
        else:
            new = {**old, "status": status, "reason": self.default["reason"]}
            if old["status"] != status:
                new.update(message=self.default["message"], lastTransitionTime=_now())
        self.condition = new
        self.kube.patch_node_status(self.node, {"status": {"conditions": [{**new, "lastHeartbeatTime": _now()}]}})
        return new


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def test_the_config_is_a_custom_plugin_monitor_for_the_agents_condition():
    assert CONFIG["plugin"] == "custom"
    (rule,) = CONFIG["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == CONDITION
    assert rule["args"] == ["gpu-check", "--node"] and rule["path"].endswith("/gpuwarden")
    assert rule["reason"] == "ResidualVRAM"
    assert {c["type"] for c in CONFIG["conditions"]} == {CONDITION}
    assert CONFIG["pluginConfig"]["max_output_length"] <= 80
    assert float(rule["timeout"].rstrip("s")) <= float(CONFIG["pluginConfig"]["timeout"].rstrip("s"))


@pytest.mark.slow  # a dozen CLI processes
def test_gpu_check_node_speaks_the_plugin_protocol(state_dir, cli):
    env = {"GPUWARDEN_BACKEND": "sim"}
    gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "init", "--gpus", "4", check=True)
    ok = cli("gpu-check", "--node", "--no-agent", env=env)
    assert ok.returncode == 0 and ok.stdout.strip() == "no residual VRAM on the node's 4 GPU(s)"
    for g in range(3):
        gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "sim", "leak", "--gpu", str(g), "--size",
                  "3GiB", check=True)
    bad = cli("gpu-check", "--node", "--no-agent", env=env)
    assert bad.returncode == 1 and bad.stdout.startswith("GPU 0: 3.0 GiB")
    assert len(bad.stdout.rstrip("\n").encode()) <= 80 and bad.stdout.count("\n") == 1  # 3 GPUs' text cut to fit
    both = cli("gpu-check", "--node", "1", env=env)
    assert both.returncode == 2 and "name no GPU" in both.stderr


def test_gpu_check_node_says_unknown_when_it_cannot_tell(state_dir, cli, tmp_path):
    # A backend that cannot read this node: NPD must get Unknown (2), not a clean bill.
    empty = tmp_path / "sys"
    empty.mkdir()
    got = cli("--sysfs-root", str(empty), "gpu-check", "--node", "--no-agent", env={"GPUWARDEN_BACKEND": "sysfs"})
    assert got.returncode == 2 and len(got.stdout.encode()) <= 81 and got.stdout.strip()


@pytest.mark.slow  # the plugin is a real process each round, as NPD runs it
def test_npd_and_the_agent_write_the_same_condition_and_never_flap(api, state_dir, settings):  # noqa: F811
    from dataclasses import replace

    from gpuwarden.ops.sampling.sampler import take_snapshot
    sim = ["--state-dir", str(state_dir), "--backend", "sim"]
    gpuwarden(*sim, "sim", "init", "--gpus", "2", check=True)
    settings = replace(settings, backend="sim")
    clock = Clock()
    agent = NodeSignal(api.kube(), NODE, policy="condition", heartbeat_s=60, clock=clock)
    # The plugin samples the same sim node itself (no agent socket in this test).
    npd = NpdMonitor(CONFIG, api.kube(), NODE, sim, ["--no-agent"])
    seen: list[tuple[str, str, str]] = []

    def both_write(rounds: int) -> None:
        for _ in range(rounds):
            clock.advance(61)  # past the agent's heartbeat: it writes every round, as NPD does
            agent.observe(take_snapshot(settings))
            c = api.condition(NODE, CONDITION)
            seen.append(("agent", c["status"], c["reason"]))
            npd.run_once()
            c = api.condition(NODE, CONDITION)
            seen.append(("npd", c["status"], c["reason"]))

    both_write(1)
    assert {s[1:] for s in seen} == {("False", "NoResidualVRAM")}
    gpuwarden(*sim, "sim", "leak", "--gpu", "1", "--size", "3GiB", check=True)
    seen.clear()
    both_write(2)
    assert {s[1:] for s in seen} == {("True", "ResidualVRAM")}, seen
    assert npd.condition["message"] == agent.condition["message"]  # short enough to be the same text
    gpuwarden(*sim, "sim", "init", "--gpus", "2", check=True)  # a fresh node: the leak is gone
    seen.clear()
    both_write(1)
    assert {s[1:] for s in seen} == {("False", "NoResidualVRAM")}, seen
