"""What read deadlines cost `status` and a refresh: this tree against a peer (the code before), same run, same node.

Measures, per tree: `status --json` wall time on a 4-GPU sim node (best and median of --runs), its import time
(`python -X importtime`, the sum over every module, best of --runs) and module count, and the in-process
refresh of an 8-GPU sim node (Sampler.snapshot, median µs). Bare `python -c pass` is measured beside them. Then,
this tree only, `status` on a node whose every GPU hangs (the peer would never return).

    python tests/bench/bench_deadlines.py [--peer main] [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]

REFRESH = r'''
import json, sys, time
from pathlib import Path
from gpuwarden.ops.sampling.sampler import Sampler
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
state = Path(sys.argv[1])
SimNode(state).init(gpus=8, vram=8 << 30, force=True)
sampler = Sampler(Settings(state_dir=state, backend="sim"))
sampler.snapshot(deep=True)
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    sampler.snapshot(deep=False)
    times.append(time.perf_counter() - t)
sampler.close()
print(json.dumps(sorted(times)[len(times) // 2]))
'''


def status_ms(env: dict, state: Path, runs: int, *extra: str) -> list[float]:
    cmd = [sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim", *extra,
           "status", "--json"]
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, timeout=60)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def import_ms(env: dict, state: Path, runs: int) -> tuple[float, int]:
    """Best total import time of `status --json` (ms, every module's self time) and its module count."""
    best, count = float("inf"), 0
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuwarden.tui.main", "--state-dir",
                               str(state), "--backend", "sim", "status", "--json"], env=env, capture_output=True,
                              text=True, timeout=60)
        rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
        rows = [r for r in rows if r[0].split(":")[1].strip().isdigit()]
        total = sum(int(r[0].split(":")[1]) for r in rows) / 1e3
        if total < best:
            best, count = total, len(rows)
    return best, count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="main")
    ap.add_argument("--runs", type=int, default=15)
    opts = ap.parse_args()
    print(benchlib.machine_line())
    with tempfile.TemporaryDirectory(prefix="bench-deadlines-") as tmp:
        tmp_path = Path(tmp)
        rows = []
        for name, tree in benchlib.compared_trees(REPO, opts.peer, tmp_path).items():
            env = benchlib.linked_env(tree, tmp_path / f"pkgs-{len(rows)}")
            state = tmp_path / f"state-{len(rows)}"
            subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "sim", "init",
                            "--gpus", "4"], env=env, check=True, capture_output=True)
            status_ms(env, state, 2)  # writes the tree's __pycache__
            wall = status_ms(env, state, opts.runs)
            imp, modules = import_ms(env, state, opts.runs)
            refresh = json.loads(subprocess.run([sys.executable, "-c", REFRESH, str(tmp_path / f"r{len(rows)}"), "300"],
                                                env=env, capture_output=True, text=True, check=True).stdout)
            rows.append((name, min(wall), statistics.median(wall), imp, modules, refresh * 1e6, env, state))
        bare = []
        for _ in range(opts.runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], capture_output=True, env=benchlib.tree_env(tmp_path))
            bare.append((time.perf_counter() - t) * 1e3)
        print(f"bare python -c pass: best {min(bare):.1f} ms, median {statistics.median(bare):.1f} ms")
        print("| tree | status --json best | median | imports (sum) | modules | 8-GPU refresh (median) |")
        print("|---|---|---|---|---|---|")
        for name, best, med, imp, modules, refresh, *_ in rows:
            print(f"| {name} | {best:.1f} ms | {med:.1f} ms | {imp:.1f} ms | {modules} | {refresh:.0f} us |")
        a, b = rows[0], rows[1]
        print(f"ratios this/peer: status best {a[1] / b[1]:.2f}, imports {a[3] / b[3]:.2f}, refresh {a[5] / b[5]:.2f}")
        env, state = rows[0][6], rows[0][7]
        subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "sim", "fault", "hang",
                        "on"], env=env, check=True, capture_output=True)
        try:
            hung = status_ms(env, state, 3, "--read-timeout", "1")
            print(f"this tree, every GPU hung, --read-timeout 1: status --json best {min(hung):.0f} ms "
                  f"(the peer never returns)")
        finally:
            subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "sim", "fault",
                            "hang", "off"], env=env, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
