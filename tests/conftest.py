"""Shared pytest fixtures: a private state dir, the captured fixtures, and running the real CLI.

Tests run the installed `gpuwarden` in subprocesses where behaviour at the process boundary matters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"  # captured public outputs; provenance in its SOURCES.md


@pytest.fixture
def fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"captured fixtures not found at {FIXTURES}: the checkout is incomplete")
    return FIXTURES


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def settings(state_dir: Path):
    from gpuwarden.ops.settings import Settings
    return Settings(state_dir=state_dir, config_path=state_dir / "node.toml")


def gpuwarden(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
              input: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process (stdin not a terminal), return the completed process."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("GPUWARDEN_BACKEND", None) if env is not None and "GPUWARDEN_BACKEND" not in env else None
    proc = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", *args], env=full_env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          input=input if input is not None else "")
    if check and proc.returncode != 0:
        raise AssertionError(f"gpuwarden {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli(state_dir: Path):
    """Call the CLI against this test's state dir: cli("status", "--json")."""
    def call(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
        return gpuwarden("--state-dir", str(state_dir), *args, env=env, **kw)
    return call


# --- the simulated node, one fixture per meaning --------------------------------------------------------
# A test module says which node it runs on with SIM_NODE = {"gpus": N, "vram": "SIZE"} (None: the tests make
# their own); without one, two GPUs of 8 GiB.
DEFAULT_SIM_NODE = {"gpus": 2, "vram": "8GiB"}


def _sim_node(request) -> dict | None:
    return getattr(request.module, "SIM_NODE", DEFAULT_SIM_NODE)


def _init_args(shape: dict) -> list[str]:
    args = ["sim", "init", "--gpus", str(shape.get("gpus", 2))]
    return args + (["--vram", shape["vram"]] if "vram" in shape else [])


@pytest.fixture
def sim_state(cli, state_dir: Path, request) -> Path:
    """The state dir of a simulated node made by `gpuwarden sim init`."""
    shape = _sim_node(request)
    if shape is not None:
        proc = cli(*_init_args(shape))
        assert proc.returncode == 0, proc.stderr
    return state_dir


@pytest.fixture
def sim_cli(cli, state_dir: Path, request):
    """The CLI against a simulated node: sim_cli("status", "--json") runs `gpuwarden --backend sim status --json`."""
    def run(*args: str, **kw) -> subprocess.CompletedProcess:
        return cli("--backend", "sim", *args, **kw)
    shape = _sim_node(request)
    if shape is not None:
        run(*_init_args(shape), check=True)
    return run


@pytest.fixture
def sim_settings(state_dir: Path, request):
    """Settings for a simulated node made in-process (no CLI), for tests that call ops directly."""
    from gpuwarden.ops.settings import Settings
    from gpuwarden.ops.sim.node import SimNode
    from gpuwarden.ops.units import parse_size
    shape = _sim_node(request) or DEFAULT_SIM_NODE
    SimNode(state_dir).init(gpus=shape.get("gpus", 2), vram=parse_size(shape.get("vram", "8GiB")))
    return Settings(state_dir=state_dir, config_path=state_dir / "node.toml", backend="sim")


@pytest.fixture(scope="session")
def standins(tmp_path_factory) -> Path:
    """The interposer tests' stand-in runtimes and unmodified engines (tests/standins/preload), built once."""
    from engines.preload_harness import build_standins
    return build_standins(tmp_path_factory.mktemp("standins"))


# Real sshd servers in front of sim nodes, started once per session for the fleet tests.
from sshfleet import ssh_fleet  # noqa: E402,F401
