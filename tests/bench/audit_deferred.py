"""Lists every import made inside a function in the package, and what hoisting it would cost a hot path.

For each: the module it is in, the target, whether that module is loaded by `status --json` / `--help` (sim node,
no agent; `python -X importtime`), and the target's cumulative import time (0 when that path loads it anyway).

    python tests/bench/audit_deferred.py [--threshold-ms 0.5]
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ops", "playbooks", "tui", "deploy")
PATHS = {"status --json": ("--backend", "sim", "status", "--json"), "--help": ("--help",)}


def function_imports() -> list[tuple[str, int, str, bool]]:
    """(module, line, target, has a '# deferred:' comment) for each import inside a function."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            module = "gpuwarden." + ".".join(path.relative_to(REPO).with_suffix("").parts)
            for fn in ast.walk(ast.parse(text)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        targets = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        base = node.module or ""
                        if node.level:
                            base = ".".join(module.split(".")[:-node.level] + ([base] if base else []))
                        targets = [base]
                    else:
                        continue
                    around = lines[node.lineno - 2:node.end_lineno or node.lineno]
                    commented = any("# deferred:" in line for line in around)
                    found.extend((module, node.lineno, t, commented) for t in targets)
    return list({(m, n, t, c): None for m, n, t, c in found})


def importtime(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Module -> cumulative import time in ms, as `python -X importtime` reports it for argv."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, capture_output=True, text=True,
                          timeout=120)
    out = {}
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            out[name.strip()] = int(cumulative) / 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threshold-ms", type=float, default=0.5)
    opts = ap.parse_args()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="audit-deferred-") as tmp:
        state = ["--state-dir", tmp]
        subprocess.run([sys.executable, "-m", "gpuwarden", *state, "sim", "init", "--gpus", "2"], env=env,
                       capture_output=True, timeout=120)
        loaded = {name: importtime(["-m", "gpuwarden", *state, *argv], env) for name, argv in PATHS.items()}
    alone: dict[str, float] = {}
    print("| module | line | target | on hot path | hoisting cost ms | # deferred: |")
    print("|---|---|---|---|---|---|")
    rows = function_imports()
    for module, line, target, commented in rows:
        paths = [name for name, mods in loaded.items() if module in mods]
        if target not in alone:
            alone[target] = importtime(["-c", f"import {target}"], env).get(target, 0.0)
        cost = 0.0 if all(target in loaded[p] for p in paths) and paths else alone[target]
        if not paths:
            cost = 0.0
        print(f"| {module} | {line} | {target} | {', '.join(paths) or '-'} | {cost:.2f} | {'yes' if commented else 'no'} |")
    hot = sum(1 for m, _, t, _ in rows if any(m in mods for mods in loaded.values()))
    print(f"\n{len(rows)} function-level imports, {sum(c for *_, c in rows)} with '# deferred:', {hot} in modules on a "
          f"hot path; threshold {opts.threshold_ms} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
