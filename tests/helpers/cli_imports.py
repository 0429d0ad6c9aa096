"""What several test files share with test_cli_imports.py: HEAVY_STDLIB, bare_python, imported, over_budget.

Taken out of test_cli_imports.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from helpers.paths import REPO


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
