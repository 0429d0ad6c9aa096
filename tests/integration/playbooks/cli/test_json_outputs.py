"""Every `--json` output of the real commands names its published schema and validates against it.

One sim node, one arena, one engine-less state dir: each command runs once as the program, in a child process.
"""

from __future__ import annotations

import json

import pytest

from gpuwarden.ops.foundation import jsondoc


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from helpers.cli import gpuwarden
    base = tmp_path_factory.mktemp("jsonout")
    state = base / "state"

    def run(*args: str, expect: tuple[int, ...] = (0,)):
        proc = gpuwarden("--state-dir", str(state), "--backend", "sim", *args, env={})
        assert proc.returncode in expect, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout
    run("sim", "init", "--gpus", "2", "--vram", "8GiB")
    run("arena", "create", str(base / "a.arena"), "--size", "8MiB", "--chunk-size", "4MiB", "--quiet")
    return base, state, run


def docs(text: str) -> list[dict]:
    """The documents of an output: one pretty-printed object, or one object per line."""
    text = text.strip()
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def check(text: str, schema: str) -> list[dict]:
    out = docs(text)
    assert out, "no JSON printed"
    for d in out:
        assert next(iter(d)) == "schema" and d["schema"] == schema, d.get("schema")
        jsondoc.validate(d)
    return out


def test_status_and_sim_show(node):
    base, state, run = node
    check(run("status", "--json"), "gpuwarden.snapshot/1")
    check(run("sim", "show", "--json"), "gpuwarden.sim-node/1")


def test_arena_commands(node):
    base, state, run = node
    arena = str(base / "a.arena")
    [made] = check(run("arena", "verify", arena, "--json", "--quiet"), "gpuwarden.arena-verify/1")
    assert made["created_iso"].endswith("Z")
    check(run("arena", "inspect", arena, "--json"), "gpuwarden.arena-inspect/1")
    check(run("arena", "budget", "--size", "1GiB", "--engines", "2", "--visible-gpus", "2", "--json"),
          "gpuwarden.arena-budget/1")
    check(run("arena", "verify", str(base / "missing.arena"), "--json", expect=(2,)), "gpuwarden.arena-error/1")
    check(run("arena", "create", str(base / "b.arena"), "--size", "4MiB", "--chunk-size", "4MiB", "--json"),
          "gpuwarden.arena-create/1")
    # The sim probe replays the arena incident by default (the canary's pinned allocation fails, it dies): exit 1.
    [probe] = check(run("arena", "probe", "--engines", "1", "--runtime", "sim", "--size", "4MiB", "--json",
                        expect=(1,)), "gpuwarden.arena-probe/1")
    assert probe["canaries"][0]["ended"] == "SIGSEGV"


def test_playbook_lines_baseline_journal_engines(node):
    base, state, run = node
    lines = check(run("baseline", "record", "--yes", "--json"), "gpuwarden.playbook-event/1")
    assert lines[0]["kind"] == "planned" and lines[-1]["kind"] == "done"
    check(run("drain", "1", "--dry-run", "--json"), "gpuwarden.playbook-event/1")
    check(run("fix", "1", "--dry-run", "--json"), "gpuwarden.playbook-event/1")
    check(run("baseline", "show", "--json"), "gpuwarden.baseline/1")
    check(run("journal", "--json"), "gpuwarden.journal-entry/1")
    [eng] = check(run("engines", "list", "--json"), "gpuwarden.engines/1")
    assert eng["engines"] == []
    check(run("engines", "stop", "--all", "--json"), "gpuwarden.engine-actions/1")
    check(run("agent", "--install-systemd", "--unit-dir", str(base), "--json"), "gpuwarden.playbook-event/1")
    assert not (base / "gpuwarden-agent.service").exists()  # a dry run without --yes


def test_config_bundle_triage_history_and_errors(node):
    base, state, run = node
    conf = base / "node.toml"
    conf.write_text(run("config", "example"))
    check(run("--config", str(conf), "config", "check", "--no-node", "--json"), "gpuwarden.config/1")
    [b] = check(run("bundle", "--output", str(base / "b.tar.gz"), "--json"), "gpuwarden.bundle/1")
    check(run("triage", b["path"], "--json", expect=(0, 1)), "gpuwarden.triage/1")
    check(run("history", "--json", expect=(2,)), "gpuwarden.error/1")  # no agent has run here
    check(run("status", "--bundle", b["path"], "--json", expect=(0, 1)), "gpuwarden.snapshot/1")


def test_gpu_check_and_the_kubernetes_fields_of_a_snapshot(node):
    base, state, run = node
    [doc] = check(run("gpu-check", "--no-agent", "--json", expect=(0, 1)), "gpuwarden.gpu-check/1")
    assert doc["source"] == "sampled here"
    # What `agent --kubernetes` adds (its end-to-end test validates the real one): pods, holders' pods, the block.
    from dataclasses import replace

    from helpers.k8s import snapshot
    from gpuwarden.ops.foundation.model import GpuProcess, Holder, PodGpus
    h = Holder(pid=77, start_time=1.0, reason="zombie", gpus=(0,), vram_bytes=1 << 30, namespace="team-a",
               pod="trainer-0", pod_uid="u-1", container_name="main", pod_deleted_at=900.0)
    snap = replace(snapshot({0: 1 << 30}, {0: [h]}), pods=(PodGpus("team-a", "trainer-0", "main", (0,), "u-1", 900.0),),
                   processes=(GpuProcess(pid=78, start_time=2.0, user="u", command="x", state="sleeping",
                                         vram={1: 1}, namespace="team-b", pod="infer-1", container_name="srv"),),
                   kubernetes={"node": "n1", "policy": "taint", "condition": None, "taint": None, "problem": "403"})
    d = json.loads(snap.to_json())
    jsondoc.validate(d)
    assert d["pods"][0]["deleted_at_iso"] and d["residual"][0]["holders"][0]["pod_deleted_at_iso"]
