"""The runner's promises for the node-changing playbooks: --dry-run changes nothing, no terminal and no
--yes runs nothing destructive, and on a real terminal the operator's answer decides."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pytest

from helpers.journal import read_journal
from gpuwarden.ops.node import nodestate, procs
from helpers.simnode import cli_argv, on_terminal, start_tenant
from helpers.reaper_family import holds_sim_vram, start_family
from helpers.simnode import proc_state, wait_for


@pytest.fixture
def node(cli, state_dir, tmp_path):
    """A node with a zombie holder on GPU 1, an ownerless leak on GPU 2, a drained GPU 0,
    a healthy tenant on GPU 3, and an unmapped arena file."""
    def sim(*args, **kw):
        return cli("--backend", "sim", *args, **kw)
    sim("sim", "init", "--gpus", "4", check=True)
    fam = start_family(cli_argv(state_dir, "sim", "hold", "--gpu", "1", "--size", "2GiB"))
    assert wait_for(lambda: holds_sim_vram(state_dir, fam.tenant), 20)
    os.kill(fam.tenant, signal.SIGKILL)
    assert wait_for(lambda: proc_state(fam.tenant) == "Z", 5)
    sim("sim", "leak", "--gpu", "2", "--size", "3GiB", check=True)
    nodestate.set_drained(state_dir, 0, True, who="test")
    tenant = start_tenant(state_dir, 3, "1GiB")
    arena = tmp_path / "old.arena"
    from gpuwarden.ops.arena import format as fmt
    arena.write_bytes(fmt.MAGIC + bytes(4088))
    yield sim, fam, tenant, arena
    tenant.terminate()
    tenant.wait(10)
    fam.stop()


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _procs(pids) -> dict[int, tuple]:
    return {pid: (procs.identity(pid), proc_state(pid)) for pid in pids}


PLAYBOOKS = [
    ("purge", "--arenas", "--arena", "{arena}", "--drop-caches", "--escalate-reset"),
    ("purge", "1"),
    ("drain", "3"),
    ("undrain", "0"),
    ("reset", "2", "--force"),
    ("baseline", "record", "2", "--force"),
]


def test_dry_run_changes_nothing(node, state_dir):
    sim, fam, tenant, arena = node
    watched = [fam.tenant, fam.parent, fam.keeper.pid, tenant.pid]
    sim("status")  # let the sim driver settle its files once
    before_tree, before_procs = _tree(state_dir), _procs(watched)
    for args in PLAYBOOKS:
        args = [a.format(arena=arena) for a in args]
        proc = sim(*args, "--dry-run")
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        if proc.returncode == 0:
            assert "nothing changed" in proc.stdout, args
    assert _tree(state_dir) == before_tree
    assert _procs(watched) == before_procs
    assert proc_state(fam.tenant) == "Z" and arena.exists()
    # The plans did show the destructive steps they would take.
    plan = sim("purge", "--dry-run").stdout
    assert f"reap zombie pid {fam.tenant}" in plan


@pytest.mark.parametrize("args", [("purge",), ("drain", "3"), ("reset", "2", "--force")])
def test_no_terminal_and_no_yes_runs_nothing(node, state_dir, args):
    sim, fam, tenant, arena = node
    drained = nodestate.drained(state_dir)
    proc = sim(*args)
    assert proc.returncode == 1
    assert "pass --yes" in proc.stdout + proc.stderr
    assert proc_state(fam.tenant) == "Z" and tenant.poll() is None
    assert nodestate.drained(state_dir) == drained
    assert json.loads(sim("sim", "show", "--json").stdout)["resets"] == {}
    journal = read_journal(state_dir)
    assert journal[-1]["result"] == "refused" and journal[-1]["action"] == args[0]
    assert not any(e["action"] == "reaper-signal" for e in journal)


def test_terminal_confirmation_decides(node, state_dir):
    sim, fam, tenant, arena = node
    rc, out = on_terminal(cli_argv(state_dir, "drain", "2", "--timeout", "0.2"), b"n\n")
    assert "Proceed?" in out and rc == 1 and "cancelled" in out
    assert 2 not in nodestate.drained(state_dir)
    rc, out = on_terminal(cli_argv(state_dir, "drain", "2", "--timeout", "0.2"), b"y\n")
    assert "Proceed?" in out
    assert 2 in nodestate.drained(state_dir)  # ran (and failed only on the leak it cannot clear)


def test_one_playbook_object_can_be_planned_twice(node, state_dir):
    # The TUI shows a dry run first and then runs the same object: the plan must not double up.
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.playbooks.framework import run
    from gpuwarden.playbooks.purge import PurgePlaybook
    sim, fam, tenant, arena = node
    pb = PurgePlaybook(1, grace_s=1)
    settings = Settings(state_dir=state_dir, backend="sim")
    first = run(pb, settings, dry_run=True)
    second = run(pb, settings, dry_run=True)
    steps = [[s["name"] for s in r.events[-2].data["steps"]] for r in (first, second)]
    assert steps[0] == steps[1] == [f"pid-{fam.tenant}", "verify"]
    done = run(pb, settings, assume_yes=True)
    assert done.ok and proc_state(fam.tenant) is None
