"""Shared pytest fixtures: a private state dir, the captured fixtures, and running the real CLI.

Tests run the installed `gpuwarden` in subprocesses where behaviour at the process boundary matters.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from helpers.paths import FIXTURES, REPO
from helpers.cli import gpuwarden, wheel_build_module


def pytest_configure(config: pytest.Config) -> None:
    """The signal dispositions a terminal gives; then compile the package and the test helpers once, in the
    controller, before any child starts.

    A suite started in a script's background (`cmd &`: SIGINT and SIGQUIT ignored) or under nohup (SIGHUP ignored)
    would hand those to every child, and an ignored signal stays ignored across exec: the tests that interrupt a
    command (test_exit_codes.py, test_exit_code_table.py) then saw it run on. Such a child's own handling of an
    inherited ignored signal is tested where a test ignores it on purpose.

    The suite starts thousands of `gpuwarden` children. Where PYTHONDONTWRITEBYTECODE is set (the image of the
    machines here sets it) no child may write the bytecode it compiles, so each one compiled every module it imported
    from source again: about 0.2 s of CPU per child here, a fifth of the suite's CPU. py_compile writes the
    cache files whatever that variable says; the children then read them like any installed package's."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    import compileall
    import re
    skip = re.compile(r"/(fixtures|triage_corpus|bench|\.venv|build)/")
    for part in ("ops", "playbooks", "tui", "tests"):
        compileall.compile_dir(REPO / part, quiet=2, workers=0, rx=skip)
    for module in ("__init__.py", "__main__.py"):
        compileall.compile_file(REPO / module, quiet=2)


@pytest.fixture
def fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"captured fixtures not found at {FIXTURES}: the checkout is incomplete")
    return FIXTURES


@pytest.fixture(scope="session")
def manylinux_wheel(tmp_path_factory):
    """manylinux_wheel(arch) -> gpuwarden's manylinux2014 wheel for arch, built at most once a session and shared
    by every test that installs or unpacks one; None without PyPI's ziglang (the test extra has it)."""
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return lambda arch: None
    build = wheel_build_module()
    out = tmp_path_factory.mktemp("dist")
    try:  # this venv's own backend when it is the one pyproject asks for: no isolated env per wheel
        import setuptools
        import wheel  # noqa: F401
        own = int(setuptools.__version__.split(".")[0]) >= 68
    except ImportError:
        own = False
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build.build_wheel(arch, out, isolated=not own)
        return built[arch]
    return get


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def settings(state_dir: Path):
    from gpuwarden.ops.foundation.settings import Settings
    return Settings(state_dir=state_dir, config_path=state_dir / "node.toml")


@pytest.fixture
def cli(state_dir: Path):
    """Call the CLI against this test's state dir: cli("status", "--json")."""
    def call(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
        return gpuwarden("--state-dir", str(state_dir), *args, env=env, **kw)
    return call


# --- the simulated node, one fixture per meaning --------------------------------------------------------
# A test module says which node it runs on with SIM_NODE = {"gpus": N, "vram": "SIZE"} (and "partition": "CPX" for
# MI300 partitions; None: the tests make their own); without one, two GPUs of 8 GiB.
DEFAULT_SIM_NODE = {"gpus": 2, "vram": "8GiB"}


def _sim_node(request) -> dict | None:
    return getattr(request.module, "SIM_NODE", DEFAULT_SIM_NODE)


def _init_args(shape: dict) -> list[str]:
    args = ["sim", "init", "--gpus", str(shape.get("gpus", 2))]
    args += ["--partition", shape["partition"]] if "partition" in shape else []
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
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    from gpuwarden.ops.foundation.units import parse_size
    shape = _sim_node(request) or DEFAULT_SIM_NODE
    SimNode(state_dir).init(gpus=shape.get("gpus", 2), vram=parse_size(shape.get("vram", "8GiB")))
    return Settings(state_dir=state_dir, config_path=state_dir / "node.toml", backend="sim")


@pytest.fixture(scope="session")
def standins(tmp_path_factory) -> Path:
    """The interposer tests' stand-in runtimes and unmodified engines (tests/standins/preload), built once."""
    from engines.preload_harness import build_standins
    return build_standins(tmp_path_factory.mktemp("standins"))


@pytest.fixture(scope="session")
def real_hip() -> Path:
    """The directory of ROCm 5.4's real libamdhip64.so (tests/helpers/realhip.py fetches it once); skipped where it
    cannot run, and on a machine with /dev/kfd, where the real runtime would use the GPU for real."""
    from helpers import realhip
    why = realhip.unsupported()
    if why:
        pytest.skip(why)
    if Path("/dev/kfd").exists():
        pytest.skip("this machine has /dev/kfd: the real runtime would register and allocate for real")
    try:
        return realhip.ensure()
    except Exception as exc:  # a test that cannot get its runtime says why, in one line
        pytest.fail(f"cannot get ROCm 5.4's libamdhip64.so: {exc}")


# Real sshd servers in front of sim nodes, started once per session for the fleet tests.
from helpers.sshfleet import ssh_fleet  # noqa: E402,F401
