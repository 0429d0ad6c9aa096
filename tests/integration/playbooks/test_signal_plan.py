"""Nothing signalled unseen (issue 35): every plan names the processes it may signal, the reaper sends nothing
else, guarded roles need --end-parents, unattended policies never end a parent or an engine.

Real processes (a zombie under a live parent that never reaps), the simulated node, and the CLI (text, --json).
"""

from __future__ import annotations

import json
import os

import pytest
import signal
import subprocess
import sys

from engines.harness import records, start_sim_tenant_engine, supervised  # noqa: F401

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.node import procs
from gpuwarden.ops.clean.reaper import Reaper, Target
from gpuwarden.playbooks.signalplan import (CONTAINER_INIT, PLAIN, Classifier, SignalPlan, command_parts)
from gpuwarden.playbooks.drain import DrainPlaybook
from gpuwarden.playbooks.framework import run
from gpuwarden.playbooks.purge import PurgePlaybook
from helpers.journal import read_journal
from helpers.simnode import cli_argv, start_careless_parent, wait_for
from helpers.reaper_family import holds_sim_vram, start_family
from helpers.simnode import proc_state

SIM_NODE = {"gpus": 2, "vram": "8GiB"}


def _events(proc) -> list[dict]:
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    for e in events:
        jsondoc.validate(e)
    return events


def _zombie_under_live_parent(state_dir):
    """A real tenant holding sim VRAM, SIGKILLed under a parent that never reaps it: (family, zombie ticks)."""
    fam = start_family(cli_argv(state_dir, "sim", "hold", "--gpu", "1", "--size", "1GiB"))
    wait_for(lambda: holds_sim_vram(state_dir, fam.tenant), 20, "the tenant to hold VRAM")
    ticks = procs.identity(fam.tenant)
    os.kill(fam.tenant, signal.SIGKILL)
    wait_for(lambda: proc_state(fam.tenant) == "Z", 5, "the tenant to become a zombie")
    return fam, ticks



@pytest.fixture
def settings(state_dir):
    """The suite's node is simulated, and no command falls back to it on its own (ops/node/backends/select.py)."""
    from gpuwarden.ops.foundation.settings import Settings
    return Settings(state_dir=state_dir, config_path=state_dir / "node.toml", backend="sim")

def test_fix_names_the_zombies_parent_before_signalling_it_and_journals_what_was_sent(sim_cli, state_dir):
    fam, _ = _zombie_under_live_parent(state_dir)
    try:
        plan = sim_cli("fix", "1", "--dry-run", "--json")
        assert plan.returncode == 0, plan.stdout + plan.stderr
        planned = next(e for e in _events(plan) if e["kind"] == "planned")
        [parent] = planned["data"]["signals"]
        assert parent["pid"] == fam.parent and parent["role"] == PLAIN and parent["user"]
        # Program name first, the rest of its (redacted) command line after it: not "python3 -m g".
        assert parent["command"].startswith(parent["program"] + " -c ") and parent["program"].startswith("python")
        assert parent["signals"] == ["SIGCHLD", "SIGTERM", "SIGKILL"]
        assert f"zombie pid {fam.tenant}" in parent["why"]
        text = sim_cli("fix", "1", "--dry-run").stdout
        assert "processes it may signal:" in text and f"pid {fam.parent} (" in text and "plain process" in text
        assert f"through its parent pid {fam.parent}" in text

        proc = sim_cli("fix", "1", "--yes", "--json", "--grace", "1")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        journal = read_journal(state_dir)
        sent = [(e["pid"], e["signal"]) for e in journal if e["action"] == "reaper-signal" and e["result"] == "ok"]
        assert sent and all(pid == fam.parent for pid, _ in sent), sent
        started = next(e for e in journal if e["action"] == "fix" and e["result"] == "started")
        assert [p["pid"] for p in started["signal_plan"]] == [fam.parent]
        after = next(e for e in journal if e["action"] == "fix:signals")
        assert after["processes"][0]["sent"] == [s for _, s in sent] and after["sent"] == len(sent)
    finally:
        fam.stop()


def test_the_reaper_sends_nothing_the_plan_does_not_list(settings):
    fam = start_family(["sleep", "60"])
    try:
        ticks = procs.identity(fam.tenant)
        os.kill(fam.tenant, signal.SIGKILL)
        wait_for(lambda: proc_state(fam.tenant) == "Z", 5, "a zombie")
        # An empty plan: the parent is not named, so it gets nothing, not even SIGCHLD.
        out = Reaper(settings, grace_s=0.5, reap_wait_s=0.2, plan=SignalPlan()).handle(
            Target(fam.tenant, ticks, "zombie"))
        assert out.result == "reported" and "did not name it" in out.detail and out.signals == []
        assert proc_state(fam.parent) == "S" and proc_state(fam.tenant) == "Z"
        lines = [e for e in read_journal(settings.state_dir) if e["action"] == "reaper-signal"]
        assert [(e["result"], e["signal"]) for e in lines] == [("refused", "SIGCHLD")]
        # A plan that only asks the parent to reap: SIGCHLD goes, TERM never does.
        plan = SignalPlan([Classifier(settings.proc_root).entry(
            fam.parent, procs.identity(fam.parent), ["SIGCHLD"], "parent of the zombie")])
        out = Reaper(settings, grace_s=0.5, reap_wait_s=0.2, plan=plan).handle(Target(fam.tenant, ticks, "zombie"))
        assert out.result == "reported" and out.signals == [f"SIGCHLD->{fam.parent}"]
        assert proc_state(fam.parent) == "S" and plan.entries[0].sent == ["SIGCHLD"]
    finally:
        fam.stop()


def test_an_unattended_purge_only_asks_the_parent_to_reap(sim_state, state_dir, settings):
    parent, child = start_careless_parent(state_dir, 0, "1GiB")
    try:
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: proc_state(child) == "Z", 5, "a zombie")
        events = []
        result = run(PurgePlaybook(0, dead_only=True, end_parents=True, timeout_s=1.0), settings,
                     sink=events.append, assume_yes=True)
        planned = next(e for e in events if e.kind == "planned").data["signals"]
        assert [(p["pid"], p["signals"]) for p in planned] == [(parent.pid, ["SIGCHLD"])]
        assert "unattended policy only asks it to reap" in planned[0]["withheld"]
        assert not result.ok and parent.poll() is None  # reported and stopped: the parent lives
        sent = {e["signal"] for e in read_journal(state_dir) if e["action"] == "reaper-signal" and e["result"] == "ok"}
        assert sent == {"SIGCHLD"}
    finally:
        parent.kill()
        parent.wait()


def test_the_agents_drain_names_an_engine_and_leaves_it_running(sim_cli, supervised, settings):  # noqa: F811
    state_dir = supervised
    start_sim_tenant_engine(state_dir, "dp0", 0, "1GiB")
    events = []
    result = run(DrainPlaybook(0, timeout_s=1.0, stop_engines=False), settings.with_(state_dir=state_dir),
                 sink=events.append, assume_yes=True)
    planned = next(e for e in events if e.kind == "planned").data["signals"]
    roles = {p["role"]: p for p in planned}
    assert set(roles) == {"supervised-engine", "engine-launcher"} and all(p["signals"] == [] for p in planned)
    assert all("never ends a supervised engine" in p["withheld"] for p in planned)
    assert result.failed_step == "stop-engines" and records(state_dir)["dp0"]["phase"] == "serving"


def test_a_containers_init_is_ended_only_with_end_parents(settings, tmp_path):
    # `unshare -pf` makes its child PID 1 of a new PID namespace, as a container runtime does.
    import shutil
    import pytest
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to make a PID namespace")
    code = "import subprocess,time; c=subprocess.Popen(['sleep','60']); print(c.pid, flush=True); time.sleep(60)"
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", code],
                             stdout=subprocess.PIPE, text=True)
    try:
        def init_pid():
            for pid in open(f"/proc/{outer.pid}/task/{outer.pid}/children").read().split():
                return int(pid)
        pid = wait_for(init_pid, 5, "the namespace's init")
        ticks = procs.identity(pid)
        who = Classifier(settings.proc_root)
        assert who.role(pid)[0] == CONTAINER_INIT
        held = who.entry(pid, ticks, ["SIGCHLD", "SIGTERM", "SIGKILL"], "parent of a zombie")
        assert held.signals == ["SIGCHLD"] and "--end-parents" in held.withheld
        allowed = who.entry(pid, ticks, ["SIGCHLD", "SIGTERM", "SIGKILL"], "parent of a zombie", end_guarded=True)
        assert allowed.signals == ["SIGCHLD", "SIGTERM", "SIGKILL"] and not allowed.withheld
        # Without --end-parents the reaper reports instead of ending it.
        out = Reaper(settings, grace_s=0.5, plan=SignalPlan([held])).terminate(Target(pid, ticks, "operator"))
        assert out.result == "reported" and "--end-parents" in out.detail and proc_state(pid) in ("S", "R")
        out = Reaper(settings, grace_s=0.5, plan=SignalPlan([allowed])).terminate(Target(pid, ticks, "operator"))
        assert out.ok, out
    finally:
        outer.kill()
        outer.wait()


def test_the_program_name_comes_first_and_secrets_never_show(settings):
    secret = "hf_" + "a1B2" * 8
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--token", secret])
    try:
        wait_for(lambda: "--token" in procs.command_line(p.pid), 5, "its command line")
        program, command = command_parts(p.pid, settings.proc_root)
        assert program == os.path.basename(sys.executable) and command.startswith(program + " -c ")
        assert secret not in command and "[REDACTED" in command
        line = Classifier(settings.proc_root).entry(p.pid, procs.identity(p.pid), ["SIGTERM"], "a holder").line()
        assert line.startswith(f"pid {p.pid} (") and secret not in line
    finally:
        p.kill()
        p.wait()


def test_after_the_residual_scenario_purge_and_fix_name_the_careless_parent(sim_cli, state_dir):
    # The issue's own finding: the plan said "reap zombie pid N" and the run sent SIGTERM to its parent, unnamed.
    sim_cli("sim", "scenario", "residual", check=True)
    try:
        made = next(e for e in read_journal(state_dir) if e["action"] == "sim-scenario")
        zombie, parent = made["zombie"], made["parent"]
        plan = sim_cli("purge", "1", "--dry-run", "--json")
        planned = next(e for e in _events(plan) if e["kind"] == "planned")
        assert [(p["pid"], p["role"], p["signals"]) for p in planned["data"]["signals"]] == \
            [(parent, PLAIN, ["SIGCHLD", "SIGTERM", "SIGKILL"])]
        assert planned["data"]["signals"][0]["command"].startswith("python") and \
            "gpuwarden.ops.node.sim.family" in planned["data"]["signals"][0]["command"]
        text = sim_cli("purge", "1", "--dry-run").stdout
        assert f"reap zombie pid {zombie}" in text and f"through its parent pid {parent}" in text
        assert f"- pid {parent} (" in text and "gpuwarden.ops.node.sim.family" in text
        proc = sim_cli("fix", "1", "--yes", "--json", "--grace", "1")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        signalled = {e["pid"] for e in read_journal(state_dir) if e["action"] == "reaper-signal" and e["result"] == "ok"}
        assert signalled == {parent}
    finally:
        sim_cli("sim", "scenario", "clean")


def test_the_cli_offers_end_parents_on_fix_and_purge_and_yes_on_engines_stop(cli):
    for args in (("fix", "--help"), ("purge", "--help")):
        assert "--end-parents" in cli(*args).stdout
    assert "--yes" in cli("engines", "stop", "--help").stdout
