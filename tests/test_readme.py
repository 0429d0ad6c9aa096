"""The README's code blocks do what they say: its TOML is what `config example` prints, and its shell walk-
throughs run as written (the simulated node, the canary example with the sim runtime).

The shell blocks run verbatim in a private mount namespace whose /dev/shm and /tmp/gw-demo are fresh tmpfs
(the state dir 0700, as gpuwarden makes it: a world-writable one is refused),
so they use the README's own paths without meeting another run's files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
VENV_BIN = Path(sys.executable).parent


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_toml_blocks_are_what_config_example_prints():
    printed = [subprocess.run([str(VENV_BIN / "gpuwarden"), "config", "example", *args], capture_output=True,
                              text=True, check=True).stdout
               for args in ((), ("--canary", "--runtime", "sim"))]
    assert blocks("toml")[:2] == printed


def test_the_readme_config_fragments_load(tmp_path):
    """The other TOML blocks are tables of node.toml ([agent], [kubernetes]) or of the fleet config: each
    goes through the loader that reads it in production, which refuses unknown keys and bad values."""
    import tomllib

    from gpuwarden.ops.config import nodeconfig
    from gpuwarden.ops.fleet.inventory import load_fleet_config
    from gpuwarden.ops.foundation.settings import Settings
    loaded = []
    for i, text in enumerate(blocks("toml")[2:]):
        path = tmp_path / f"fragment{i}.toml"
        path.write_text(text)
        tables = list(tomllib.loads(text))
        if tables == ["fleet"]:
            assert load_fleet_config(path, explicit=True).hosts
        else:
            cfg = nodeconfig.load(Settings(state_dir=tmp_path / "state", config_path=path))
            if "agent" in tables:
                assert cfg.agent.bundle_on == ("residual", "crash", "kernel-fault")
        loaded += tables
    assert {"agent", "kubernetes", "fleet"} <= set(loaded), loaded


def _walkthroughs() -> str:
    runnable = [b for b in blocks("bash") if "gpuwarden sim scenario" in b or "--config canary.toml" in b]
    assert len(runnable) == 2, "the README's simulated-node and canary walkthroughs"
    return "\n".join(runnable)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a private /dev/shm")
def test_shell_walkthroughs_run_as_written(tmp_path):
    script = _walkthroughs()
    # Each line must succeed, except where its comment says what else it exits with.
    expected = {line.split("#")[0].strip(): int(m.group(1)) for line in script.splitlines()
                if (m := re.search(r"# exit (\d)", line))}
    wrapped = f"""
set -u
mount -t tmpfs tmpfs /dev/shm && mkdir -p /tmp/gw-demo && mount -t tmpfs -o mode=0700 tmpfs /tmp/gw-demo || exit 99
cleanup() {{ gpuwarden engines stop --all >/dev/null 2>&1; gpuwarden sim scenario clean >/dev/null 2>&1; }}
trap cleanup EXIT
trap 'echo "EXIT $? FROM: $BASH_COMMAND" >&2' ERR
{script}
"""
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    for var in ("GPUWARDEN_STATE_DIR", "GPUWARDEN_BACKEND", "GPUWARDEN_CONFIG"):
        env.pop(var, None)
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", wrapped],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 99, proc.stderr
    failed = re.findall(r"EXIT (\d+) FROM: (.*)", proc.stderr)
    unexpected = [(cmd, rc) for rc, cmd in failed if expected.get(cmd.strip()) != int(rc)]
    assert not unexpected, (unexpected, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stdout + proc.stderr
    out = proc.stdout
    assert "scenario residual: ready" in out and "GPU 2 is clean and verified after a reset" in out
    assert "canary3 died by SIGSEGV while registering" in out
    assert "2 engine(s) serving" in out and "canary1: stopped" in out
