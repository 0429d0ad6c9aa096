"""What `gpuwarden status` may load (the import budget), and the layering rule: tui -> playbooks -> ops.

status and status --json must cost about as much as starting Python: no Typer, no Textual, no playbooks,
no other command. Measured with `python -X importtime` on the real program.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentnode import start_agent
from conftest import REPO
from simnode import wait_for

FORBIDDEN = ("typer", "click", "textual", "rich", "pydantic", "jsonschema", "gpuwarden.tui.app", "gpuwarden.tui.command",
             "gpuwarden.playbooks.cli.root", "gpuwarden.playbooks.cli.commands", "gpuwarden.playbooks.framework", "gpuwarden.playbooks.cli.output", "gpuwarden.ops.bundle",
             "gpuwarden.ops.triage", "gpuwarden.ops.arena.inspect", "http", "email", "asyncio")


def imported(state_dir: Path, *args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir),
                           *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return names, proc


# Standard-library modules a sampling `status` does without (CPU ms to import on the 2-core dev box): dataclasses
# with inspect, ast and dis (~8; gpuwarden.ops.foundation.records stands in), typing (~3), shutil with bz2 and lzma (~2.5), threading
# (~1), socket and ssl (the agent's client loads socket only when an agent's socket is there), tomllib (no config).
HEAVY_STDLIB = ("dataclasses", "inspect", "ast", "dis", "typing", "shutil", "bz2", "lzma", "threading", "socket",
                "ssl", "tomllib")


def over_budget(names: set[str], forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


def bare_python() -> set[str]:
    """What this interpreter loads for nothing (site and .pth files): not status's doing."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True,
                          timeout=60)
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


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
