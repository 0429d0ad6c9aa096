"""What starting the program costs: this tree against a peer (a git ref), same run, same sim node, runs interleaved.

Median wall time of --runs runs of each command, on a 2-GPU sim node with no agent: `python -c pass` (the floor),
`status --json` and `status` (the fast path, playbooks/cli/fastcli.py) and `journal` (the full Typer CLI), and the
number of gpuwarden modules `status --json` loads. Interleaving the two trees run by run keeps a busy machine's
load from favouring either.

    python tests/bench/bench_startup.py [--peer main] [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {"status --json": ("--backend", "sim", "status", "--json"), "status": ("--backend", "sim", "status"),
            "journal (full CLI)": ("--backend", "sim", "journal")}


def once_ms(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, timeout=60)
    return (time.perf_counter() - t) * 1e3


def modules(env: dict[str, str], state: Path) -> int:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuwarden", "--state-dir", str(state),
                           *COMMANDS["status --json"]], env=env, capture_output=True, text=True, timeout=60)
    return sum(1 for line in proc.stderr.splitlines()
               if line.startswith("import time:") and line.split("|")[-1].strip().startswith("gpuwarden"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="main")
    ap.add_argument("--runs", type=int, default=20)
    opts = ap.parse_args()
    print(benchlib.machine_line())
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        tmp_path = Path(tmp)
        trees = benchlib.compared_trees(REPO, opts.peer, tmp_path)
        setups = {}
        for i, (name, tree) in enumerate(trees.items()):
            env = benchlib.linked_env(tree, tmp_path / f"pkgs-{i}")
            state = tmp_path / f"state-{i}"
            subprocess.run([sys.executable, "-m", "gpuwarden", "--state-dir", str(state), "sim", "init", "--gpus",
                            "2"], env=env, check=True, capture_output=True)
            setups[name] = (env, state)
        times: dict[tuple[str, str], list[float]] = {}
        bare = []
        for _ in range(opts.runs + 2):  # the first two write __pycache__ and warm the page cache: dropped
            bare.append(once_ms([sys.executable, "-c", "pass"], benchlib.tree_env(tmp_path)))
            for name, (env, state) in setups.items():
                for label, args in COMMANDS.items():
                    argv = [sys.executable, "-m", "gpuwarden", "--state-dir", str(state), *args]
                    times.setdefault((name, label), []).append(once_ms(argv, env))
        floor = statistics.median(bare[2:])
        print(f"python -c pass: median {floor:.1f} ms ({opts.runs} runs)")
        print("| tree | " + " | ".join(f"{label} median" for label in COMMANDS) + " | gpuwarden modules (status --json) |")
        print("|---|" + "---|" * (len(COMMANDS) + 1))
        medians = {}
        for name, (env, state) in setups.items():
            row = []
            for label in COMMANDS:
                m = statistics.median(times[(name, label)][2:])
                medians[(name, label)] = m
                row.append(f"{m:.1f} ms ({m / floor:.2f}x bare)")
            print(f"| {name} | " + " | ".join(row) + f" | {modules(env, state)} |")
        a, b = trees
        print("ratios this/peer: " + ", ".join(f"{label} {medians[(a, label)] / medians[(b, label)]:.2f}"
                                               for label in COMMANDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
