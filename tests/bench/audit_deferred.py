"""Lists every import made inside a function in the package, and what hoisting it would cost a hot path.

For each: the module it is in, the target, the hot paths that load that module (`status --json` and `--help` on a sim
node with no agent, the console's and the agent's modules; `python -X importtime`), the target's cumulative import
time (0 when every such path loads it anyway), and whether the target must stay deferred whatever it costs: an
optional extra (pyproject's optional-dependencies) or a vendor library loaded through libload.

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
# Paths measured by importing their entry modules (the console needs a terminal, the agent runs until stopped).
MODULE_PATHS = {"console": "gpuwarden.tui.app, gpuwarden.tui.command",
                "agent": "gpuwarden.ops.services.agent_daemon"}
# Imported modules of the optional extras (pyproject.toml [project.optional-dependencies]) and of the vendor
# libraries libload imports lazily by the product owner's rule: never hoisted.
EXTRAS = ("lightkube", "grpc", "google.protobuf", "asyncssh", "ClusterShell", "textual_serve", "aiohttp")
VENDOR = ("amdsmi", "hip", "pynvml", "ziglang")


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


def _within(target: str, roots: tuple[str, ...]) -> bool:
    return any(target == r or target.startswith(r + ".") for r in roots)


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
        loaded.update({name: importtime(["-c", f"import {mods}"], env) for name, mods in MODULE_PATHS.items()})
    alone: dict[str, float] = {}
    print("| module | line | target | on hot path | hoisting cost ms | must stay | # deferred: |")
    print("|---|---|---|---|---|---|---|")
    hoistable = 0
    rows = function_imports()
    for module, line, target, commented in rows:
        paths = [name for name, mods in loaded.items() if module in mods]
        if target not in alone:
            alone[target] = importtime(["-c", f"import {target}"], env).get(target, 0.0)
        cost = 0.0 if all(target in loaded[p] for p in paths) and paths else alone[target]
        if not paths:
            cost = 0.0
        stay = ("extra" if _within(target, EXTRAS) else "vendor" if _within(target, VENDOR) else
                "costly" if cost >= opts.threshold_ms else "")
        hoistable += not stay
        print(f"| {module} | {line} | {target} | {', '.join(paths) or '-'} | {cost:.2f} | {stay or '-'} | "
              f"{'yes' if commented else 'no'} |")
    hot = sum(1 for m, _, t, _ in rows if any(m in mods for mods in loaded.values()))
    print(f"\n{len(rows)} function-level imports, {sum(c for *_, c in rows)} with '# deferred:', {hot} in modules on a "
          f"hot path; {len(rows) - hoistable} must stay (extra, vendor or >= {opts.threshold_ms} ms), {hoistable} could "
          "move to their module's top")
    return 0


if __name__ == "__main__":
    sys.exit(main())
