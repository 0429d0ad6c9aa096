"""The import direction, as pyproject's import-linter contracts state it: tui -> playbooks -> ops, and inside
ops foundations -> configuration -> node reading -> domains. A new upward import or circle fails here."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from helpers.paths import REPO


def test_every_import_contract_is_kept():
    lint = REPO / ".venv" / "bin" / "lint-imports"
    cmd = [str(lint)] if lint.exists() else [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
    proc = subprocess.run([*cmd, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_the_ops_layers_name_every_part_of_ops():
    """exhaustive = true: a new module or package in ops must be given its place in the order."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    ops = next(c for c in config["contracts"] if c.get("containers") == ["gpuwarden.ops"])
    assert ops["exhaustive"] is True
    named = {part.strip() for layer in ops["layers"] for part in layer.replace("|", ":").split(":")}
    on_disk = {p.stem if p.suffix == ".py" else p.name for p in (REPO / "ops").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert on_disk == named
