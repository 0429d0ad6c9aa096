"""Every command a hint names works when pasted: each is run, as printed, in the state that produced it.

The commands under test get --state-dir and --backend on their command line, so the hints must repeat
them (gpuwarden.playbooks.cli.hints); a pasted command runs on a real terminal, where destructive playbooks ask.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Callable

import pytest
from engines.harness import start_sim_tenant_engine, stop_everything
from helpers.reaper_family import holds_sim_vram, start_family
from helpers.simnode import proc_state

from gpuwarden.ops.node import nodestate
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.playbooks.cli.hints import commands_in
from helpers.simnode import cli_argv, on_terminal, start_tenant, wait_for

pytestmark = pytest.mark.timeout(120)


class Node:
    """One simulated node in its own state dir; `stop` ends whatever a case started."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.cleanup: list[Callable[[], None]] = []

    def cli(self, *args: str):
        import subprocess
        return subprocess.run(cli_argv(self.state_dir, *args), capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    def tenant(self, gpu: int, size: str):
        t = start_tenant(self.state_dir, gpu, size)
        self.cleanup.append(lambda: (t.terminate(), t.wait(10)))
        return t

    def zombie(self, gpu: int, size: str) -> int:
        fam = start_family(cli_argv(self.state_dir, "sim", "hold", "--gpu", str(gpu), "--size", size))
        self.cleanup.append(fam.stop)
        assert wait_for(lambda: holds_sim_vram(self.state_dir, fam.tenant), 20)
        os.kill(fam.tenant, signal.SIGKILL)
        assert wait_for(lambda: proc_state(fam.tenant) == "Z", 5)
        return fam.tenant

    def stop(self) -> None:
        for fn in reversed(self.cleanup):
            fn()
        self.cleanup.clear()


def _sim(n: Node, gpus: int) -> SimNode:
    node = SimNode(n.state_dir)
    node.init(gpus=gpus, vram=24 << 30)
    return node


def _leak(n: Node) -> None:
    _sim(n, 3).leak(2, 14 << 30)


def _leak_drained(n: Node) -> None:
    _leak(n)
    nodestate.set_drained(n.state_dir, 2, True)


def _zombie(n: Node) -> None:
    _sim(n, 3)
    n.zombie(1, "2GiB")


def _tenant(n: Node) -> None:
    _sim(n, 3)
    n.tenant(1, "1GiB")


def _engine_and_leak(n: Node) -> None:
    node = _sim(n, 2)
    n.cleanup.append(lambda: stop_everything(n.state_dir))
    start_sim_tenant_engine(n.state_dir, "llm", 1, "1GiB")
    node.leak(1, 2 << 30)


def _reset_fails(n: Node) -> None:
    _leak_drained(n)
    SimNode(n.state_dir).set_fault("reset-fails", True)


def _corrupt_arena(n: Node) -> None:
    from gpuwarden.ops.arena.create import create
    path = n.state_dir / "w.arena"
    create(path, size=5 << 20, chunk_size=1 << 20)
    with open(path, "r+b") as f:
        f.seek(4096 + (3 << 20))
        f.write(b"X")


def _nothing(n: Node) -> None:
    pass


def _idle(n: Node) -> None:
    _sim(n, 2)


def _stop_tenants(n: Node) -> None:
    n.stop()


# (what the node looks like, the command that prints hints, hints it must print, what the operator does
# first when the hint asks for it ("stop it, then ..."), exit codes that count as working)
CASES = [
    ("ownerless-purge", _leak, ("purge", "2", "--yes"), ["fix 2"], None, (0,)),
    ("ownerless-drain", _leak, ("drain", "2", "--yes"), ["reset 2", "fix 2"], None, (0,)),
    ("reset-undrained", _leak, ("reset", "2", "--yes"), ["drain 2"], None, (0,)),
    ("zombie-drain", _zombie, ("drain", "1", "--yes", "--timeout", "0.5"), ["purge 1", "fix 1"], None, (0,)),
    ("tenant-drain", _tenant, ("drain", "1", "--yes", "--timeout", "0.5"), ["drain 1"], _stop_tenants, (0,)),
    ("engine-fix", _engine_and_leak, ("fix", "1", "--yes"), ["fix 1 --stop-engines"], None, (0,)),
    ("no-reset", _leak, ("fix", "2", "--yes", "--no-reset"), ["fix 2"], None, (0,)),
    ("reset-fails", _reset_fails, ("reset", "2", "--yes"), ["sim fault reset-fails off"], None, (0,)),
    ("corrupt-arena", _corrupt_arena, ("arena", "verify", "{state}/w.arena"),
     ["arena create {state}/w.arena --force --size 5MiB"], None, (0,)),
    ("arena-create-on-a-directory", _nothing, ("arena", "create", "{state}", "--size", "1MiB"),
     ["arena create {state}/weights.arena --size 1MiB"], None, (0,)),
    ("ownerless-gpu-check", _leak, ("gpu-check", "2", "--no-agent"), ["status", "fix 2"], None, (0, 1)),
    ("no-sim-node", _nothing, ("sim", "show"), ["sim init"], None, (0,)),
    ("unknown-gpu", _idle, ("fix", "9"), ["status"], None, (0, 1)),
    ("no-baseline", _idle, ("status",), ["baseline record"], None, (0,)),
    ("unknown-engine", _idle, ("engines", "logs", "nosuch"), ["engines list"], None, (0,)),
]


def _pasted(hint: str) -> list[str]:
    words = shlex.split(hint)
    assert words[0] == "gpuwarden", f"cannot paste {hint!r} here"
    return [sys.executable, "-m", "gpuwarden.tui.main", *words[1:]]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_hint_works_when_pasted(case, tmp_path):
    name, setup, command, expected, before, codes = case
    prefix = f"--state-dir {tmp_path / 'state'} --backend sim"
    n = Node(tmp_path / "state")
    n.state_dir.mkdir(exist_ok=True)
    try:
        setup(n)
        command = tuple(w.replace("{state}", str(n.state_dir)) for w in command)
        proc = n.cli(*command)
        out = proc.stdout + proc.stderr
        hints = list(dict.fromkeys(commands_in(out)))
        expected = [h.replace("{state}", str(n.state_dir)) for h in expected]
        assert hints == [f"gpuwarden {prefix} {h}" for h in expected], out
        for i, hint in enumerate(hints):
            # Each hint from the state that printed it: the first where it was printed, the others in a
            # fresh state dir where that state is built again (a pasted hint changes the node).
            m = n
            if i:
                m = Node(tmp_path / f"state-{i}")
                m.state_dir.mkdir()
                setup(m)
                m.cli(*(w.replace(str(n.state_dir), str(m.state_dir)) for w in command))
            try:
                if before is not None:
                    before(m)
                argv = _pasted(hint.replace(str(n.state_dir), str(m.state_dir)))
                rc, text = on_terminal(argv, b"y\n", timeout=60)
                assert rc in codes, (hint, rc, text)
            finally:
                if m is not n:
                    m.stop()
    finally:
        n.stop()
