"""Shell completion: --show-completion / --install-completion, and GPU indexes and engine names from the node."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.paths import REPO

GPUWARDEN = [sys.executable, "-m", "gpuwarden.tui.main"]


def complete(words: str, env: dict | None = None) -> list[str]:
    """What bash completion offers for the command line `words` (the cursor after its last word)."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    proc = subprocess.run([*GPUWARDEN], env={**os.environ, **(env or {}), "_GPUWARDEN_COMPLETE": "complete_bash",
                                             "COMP_WORDS": words, "COMP_CWORD": str(cword)},
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout.split()


def from_bash(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """gpuwarden run by an interactive user's bash: Typer finds the shell among the process's ancestors, so the
    test must not depend on what started pytest (under nohup or a CI runner there may be no shell above it)."""
    return subprocess.run(["bash", "-c", '"$@"; exit $?', "bash", *GPUWARDEN, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=env)


def test_show_and_install_completion(tmp_path):
    proc = from_bash("--show-completion")
    assert proc.returncode == 0 and "_GPUWARDEN_COMPLETE=complete_bash" in proc.stdout, proc.stderr
    home = tmp_path / "home"
    home.mkdir()
    proc = from_bash("--install-completion", env={**os.environ, "HOME": str(home), "SHELL": "/bin/bash"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "_GPUWARDEN_COMPLETE" in (home / ".bash_completions" / "gpuwarden.sh").read_text()
    assert ".bash_completions/gpuwarden.sh" in (home / ".bashrc").read_text()


def test_gpu_indexes_and_engine_names_come_from_the_node(cli, state_dir):
    cli("--backend", "sim", "sim", "init", "--gpus", "3", check=True)
    for name, gpu in (("llm-a", 0), ("llm-b", 2)):
        d = state_dir / "engines" / name
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"name": name, "gpu": gpu, "phase": "crashed"}))
    prefix = f"gpuwarden --state-dir {state_dir} --backend sim"
    assert complete(f"{prefix} fix ") == ["0", "1", "2"]
    assert complete(f"{prefix} drain 1") == ["1"]
    assert complete(f"{prefix} engines logs llm-") == ["llm-a", "llm-b"]
    assert complete(f"{prefix} engines restart llm-b") == ["llm-b"]
    assert complete("gpuwarden sim scenario re") == ["residual"]
    # Without --state-dir on the line, the variable decides, as it does for the command itself.
    assert complete("gpuwarden engines stop ", {"GPUWARDEN_STATE_DIR": str(state_dir)}) == ["llm-a", "llm-b"]
