"""What one full-CLI command costs in CPU: this tree as installed against typer 0.29 and against children that
compile every gpuwarden module they import (the suite's children under PYTHONDONTWRITEBYTECODE before
tests/conftest.py compiled the tree once).

Each configuration runs the same commands on the same sim node, interleaved run by run; the figure is the child's
user+system CPU (getrusage of the reaped child), which a busy machine inflates far less than wall time.

With --peer REF a fourth configuration runs the tree at that git ref (bytecode cached too): the before/after of a
change to how the CLI loads (the lazy root of playbooks/cli/lazy.py against the pruned eager one, for example).

    python tests/bench/bench_cli_cpu.py [--runs 15] [--peer REF]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

COMMANDS = {
    "journal -n 5": ("journal", "-n", "5"),
    "arena verify (8 MiB)": ("arena", "verify", "{arena}"),
    "fix abc (a usage error)": ("fix", "abc"),
    "engines list": ("engines", "list"),
}


def child_cpu_ms(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, capture_output=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1e3


def typer_029(into: Path) -> Path:
    """typer 0.29.2 in a folder of its own, put first on PYTHONPATH for that configuration (pydantic comes
    from the venv, where the test extra's Kyverno schema models, cloudcoil, need it)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(into),
                    "typer==0.29.2"], check=True)
    return into


def uncompiled_copy(pkgs: Path) -> Path:
    """This tree's package under pkgs/gpuwarden without any __pycache__: with PYTHONDONTWRITEBYTECODE its
    children compile every gpuwarden module they import, as the suite's did (the installed libraries keep the
    bytecode pip wrote)."""
    repo = Path(__file__).resolve().parents[2]
    dest = pkgs / "gpuwarden"
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__")
    for part in ("ops", "playbooks", "tui"):
        shutil.copytree(repo / part, dest / part, ignore=ignore)
    for module in ("__init__.py", "__main__.py"):
        shutil.copy2(repo / module, dest / module)
    return pkgs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--peer", help="also run the tree at this git ref")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        state = tmpd / "state"
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
        base["GPUWARDEN_STATE_DIR"] = str(state)
        cli = [sys.executable, "-m", "gpuwarden", "--backend", "sim"]
        subprocess.run([*cli, "sim", "init", "--gpus", "2"], env=base, check=True, capture_output=True)
        arena = tmpd / "w.arena"
        subprocess.run([*cli, "arena", "create", str(arena), "--size", "8MiB", "--chunk-size", "1MiB", "-q"],
                       env=base, check=True, capture_output=True)
        # Bytecode for this tree, written whatever PYTHONDONTWRITEBYTECODE says (what tests/conftest.py does).
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "ops", "playbooks", "tui"],
                       cwd=Path(__file__).resolve().parents[2], check=True, capture_output=True)
        repo = Path(__file__).resolve().parents[2]
        peer: dict[str, dict[str, str]] = {}
        if args.peer:
            tree = benchlib.export_tree(repo, args.peer, tmpd)
            subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "ops", "playbooks", "tui"], cwd=tree,
                           check=True, capture_output=True)
            linked = benchlib.linked_env(tree, tmpd / "peer-pkgs")
            peer[f"peer {args.peer}"] = {**base, "PYTHONPATH": linked["PYTHONPATH"]}
        configs = {
            "this tree (typer 0.28, bytecode cached)": base,
            **peer,
            "typer 0.29.2 (pydantic coercion)": {**base, "PYTHONPATH": str(typer_029(tmpd / "typer029"))},
            "gpuwarden without bytecode (compiled in each child)": {
                **base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(uncompiled_copy(tmpd / "pkgs"))},
        }
        results: dict[str, dict[str, list[float]]] = {c: {n: [] for n in COMMANDS} for c in configs}
        for _ in range(args.runs + 1):  # the first round warms the page cache, untimed
            for name, words in COMMANDS.items():
                argv = [*cli, *(w.format(arena=arena) for w in words)]
                for config, env in configs.items():
                    results[config][name].append(child_cpu_ms(argv, env))
    print(benchlib.machine_line())
    print(f"median CPU (user+sys) of one command, ms, {args.runs} runs each, interleaved")
    first = next(iter(configs))
    header = "| command | " + " | ".join(configs) + " |"
    print(header)
    print("|" + "---|" * (len(configs) + 1))
    for name in COMMANDS:
        ours = statistics.median(results[first][name][1:])
        cells = [f"{ours:.0f}"]
        for config in list(configs)[1:]:
            theirs = statistics.median(results[config][name][1:])
            cells.append(f"{theirs:.0f} ({theirs / ours:.2f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
