"""The README's and the manual's (docs/) code blocks do what they say: the TOML of docs/engines.md is what
`config example` prints, every other TOML block loads, and the shell walk-throughs run as written: the README's
five minutes on the simulated node, then docs/engines.md's canaries, in that order, as a reader would.

The shell blocks run verbatim in a private mount namespace whose /dev/shm and /run/gpuwarden (root's default
state dir, which the README's first TUI and its walk-through share) are fresh tmpfs (the state dir 0700, as
gpuwarden makes it: a world-writable one is refused), so they use the README's own paths without meeting
another run's files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

README = REPO / "README.md"
ENGINES = REPO / "docs" / "engines.md"  # where `config example`'s two outputs are shown
VENV_BIN = Path(sys.executable).parent


def pages() -> list[Path]:
    """The README, then every page of the manual."""
    return [README, *sorted((REPO / "docs").glob("**/*.md"))]


def blocks(lang: str, *where: Path) -> list[str]:
    return [b for page in (where or pages()) for b in re.findall(rf"```{lang}\n(.*?)```", page.read_text(), flags=re.S)]


def test_toml_blocks_are_what_config_example_prints():
    printed = [subprocess.run([str(VENV_BIN / "gpuwarden"), "config", "example", *args], capture_output=True,
                              text=True, check=True).stdout
               for args in ((), ("--canary", "--runtime", "sim"))]
    assert blocks("toml", ENGINES)[:2] == printed


def test_the_readme_config_fragments_load(tmp_path):
    """The other TOML blocks are tables of node.toml ([agent], [kubernetes]) or of the fleet config: each
    goes through the loader that reads it in production, which refuses unknown keys and bad values."""
    import tomllib

    from gpuwarden.ops.config import nodeconfig
    from gpuwarden.ops.fleet.inventory import load_fleet_config
    from gpuwarden.ops.foundation.settings import Settings
    loaded = []
    examples = blocks("toml", ENGINES)[:2]
    for i, text in enumerate(b for b in blocks("toml") if b not in examples):
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
    five = [b for b in blocks("bash", README) if "gpuwarden sim scenario" in b]
    canaries = [b for b in blocks("bash", ENGINES) if "--config canary.toml" in b]
    assert len(five) == 1 and len(canaries) == 1, "the README's five minutes and docs/engines.md's canaries"
    elsewhere = [b for b in blocks("bash") if "gpuwarden sim scenario" in b or "--config canary.toml" in b]
    assert len(elsewhere) == 2, "a copy of a walk-through elsewhere would go untested"
    assert "GPUWARDEN_STATE_DIR" not in five[0], "the walk-through must use the state dir step 1's TUI used"
    return "\n".join(five + canaries)


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
mount -t tmpfs tmpfs /dev/shm && mkdir -p /run/gpuwarden && mount -t tmpfs -o mode=0700 tmpfs /run/gpuwarden || exit 99
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
    assert "canary3 died by SIGSEGV while serving" in out and "canary0, canary1, canary2, canary3 registered" in out
    assert "2 engine(s) serving" in out and "canary1: stopped" in out
