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


@pytest.fixture(scope="session")
def standins(tmp_path_factory) -> Path:
    """The interposer tests' stand-in runtimes and unmodified engines (tests/standins/preload), built once."""
    from engines.preload_harness import build_standins
    return build_standins(tmp_path_factory.mktemp("standins"))


# Real sshd servers in front of sim nodes, started once per session for the fleet tests.
from sshfleet import ssh_fleet  # noqa: E402,F401
