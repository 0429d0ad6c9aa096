"""What `gpuwarden status` may load (the import budget), and the layering rule: tui -> playbooks -> ops.

status and status --json must cost about as much as starting Python: no Typer, no Textual, no playbooks,
no other command. Measured with `python -X importtime` on the real program.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.agentnode import start_agent
from helpers.paths import REPO
from helpers.simnode import wait_for
from helpers.cli_imports import HEAVY_STDLIB, bare_python, imported, over_budget

# The sim node these tests run on (conftest.py's sim_state fixture reads it).
SIM_NODE = {"gpus": 2}


def test_status_loads_no_framework_and_no_other_command(sim_state):
    for args in (("--backend", "sim", "status", "--json"), ("--backend", "sim", "status")):
        names, proc = imported(sim_state, *args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "gpuwarden.ops.sampling.sampler" in names  # it did sample
        assert over_budget(names) == [], args
        assert over_budget(names - bare_python(), HEAVY_STDLIB) == [], args


def test_status_of_a_node_with_an_engine_stays_in_budget(sim_state):
    """An engine record with a live shim and engine: status reads its state and looks for arena mappers too."""
    from gpuwarden.ops.node import procs
    from gpuwarden.ops.foundation import statedir
    from gpuwarden.ops.engines import state as st
    live = subprocess.Popen(["sleep", "60"])
    try:
        ticks = procs.identity(live.pid)
        d = st.engine_dir(sim_state, "e0")
        d.mkdir(parents=True)
        statedir.write_json(d / st.STATE, {
            "name": "e0", "gpu": 0, "phase": "serving", "shim_pid": live.pid, "shim_start": ticks, "pid": live.pid,
            "pid_start": ticks, "restarts": 0,
            "registrations": [{"kind": "register", "outcome": "registered", "bytes": 1 << 30, "started_at": 1.0}]},
            root=sim_state)
        names, proc = imported(sim_state, "--backend", "sim", "status", "--json")
        assert proc.returncode == 0 and '"name":"e0"' in proc.stdout and '"registrations":[{' in proc.stdout
        assert {"gpuwarden.ops.engines.state", "gpuwarden.ops.arena.watch"} <= names  # it did read the engine and look for mappers
        assert over_budget(names) == [] and over_budget(names - bare_python(), HEAVY_STDLIB) == []
    finally:
        live.kill()
        live.wait()


def test_status_json_via_the_agent_loads_only_the_socket_client(sim_state):
    agent = start_agent(sim_state)
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
        names, proc = imported(sim_state, "--backend", "sim", "status", "--json")
        assert proc.returncode == 0 and '"agent"' in proc.stdout
        assert over_budget(names) == []
        assert not any(n.startswith(("gpuwarden.ops.sampling", "gpuwarden.ops.foundation.model", "dataclasses", "gpuwarden.ops.node.backends")) for n in names),\
            sorted(n for n in names if n.startswith("ops"))
    finally:
        agent.stop()


def test_other_commands_still_get_the_full_cli(sim_state):
    names, proc = imported(sim_state, "--backend", "sim", "journal")
    assert proc.returncode == 0 and "typer" in names


def test_a_command_loads_its_own_command_module_and_no_other(sim_state):
    # The root group imports a command's module when the line names it (playbooks/cli/lazy.py); the old CLI
    # imported all 23 and pruned Typer's list afterwards.
    code = ("import sys, json\nfrom gpuwarden.tui import main\ncode = main.main(sys.argv[1:])\n"
            "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\nsys.exit(code)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    proc = subprocess.run([sys.executable, "-c", code, "--state-dir", str(sim_state), "--backend", "sim", "journal",
                           "-n", "1"], cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = json.loads(proc.stderr.strip().splitlines()[-1])
    from gpuwarden.playbooks.cli.root import COMMANDS
    command_modules = {target.split(":")[0] for target, _ in COMMANDS.values()}
    commands = [n for n in names if n in command_modules]  # shared option modules (playbook_options) may load
    assert commands == ["gpuwarden.playbooks.cli.commands.journal"], commands
    assert "gpuwarden.tui.command" not in names and "textual" not in names


def test_help_lists_every_command_in_order():
    proc = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    listed = [line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line.startswith("  ")
              and not line.startswith("   ")]
    assert listed[:5] == ["status", "doctor", "fix", "launch", "engines"] and {"tui", "serve", "fleet"} <= set(listed)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


@pytest.mark.parametrize("layer, banned", [("ops", ("playbooks", "tui", "textual", "typer", "click")),
                                           ("playbooks", ("tui", "textual"))])
def test_imports_point_down_only(layer, banned):
    bad = []
    for path in sorted((REPO / layer).rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in banned:
                bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert bad == []
