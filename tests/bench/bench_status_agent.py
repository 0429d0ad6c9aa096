"""`status --json` answered by a running agent (the fast path, playbooks/cli/fastcli.py): this tree against a peer
git ref, same sim node and agent, runs interleaved (no node config: /etc/gpuwarden/node.toml absent).

Median wall time and the child's user+system CPU of --runs runs each.

    python tests/bench/bench_status_agent.py [--peer main] [--runs 30]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=60)
    wall = (time.perf_counter() - t) * 1e3
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode in (0, 1), proc.stderr
    return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="main")
    ap.add_argument("--runs", type=int, default=30)
    opts = ap.parse_args()
    print(benchlib.machine_line())
    with tempfile.TemporaryDirectory(prefix="bsa-", dir="/tmp") as tmp:
        tmp_path = Path(tmp)
        state = tmp_path / "s"
        trees = benchlib.compared_trees(REPO, opts.peer, tmp_path)
        envs = {name: benchlib.linked_env(tree, tmp_path / f"pkgs-{i}") for i, (name, tree) in enumerate(trees.items())}
        first = next(iter(envs.values()))
        subprocess.run([sys.executable, "-m", "gpuwarden", "--state-dir", str(state), "sim", "init", "--gpus", "2"],
                       env=first, check=True, capture_output=True)
        agent = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--state-dir", str(state), "--backend", "sim",
                                  "agent", "--foreground", "--interval", "1"], env=first, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not (state / "agent.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            cases = {"--state-dir": ["--state-dir", str(state)]}
            samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for _ in range(opts.runs + 2):
                for name, env in envs.items():
                    for case, words in cases.items():
                        e = dict(env)
                        for var in ("GPUWARDEN_STATE_DIR", "GPUWARDEN_CONFIG"):
                            e.pop(var, None)
                        argv = [sys.executable, "-m", "gpuwarden", *words, "--backend", "sim", "status", "--json"]
                        samples.setdefault((name, case), []).append(once(argv, e))
            print("| tree | case | wall median | CPU median |")
            print("|---|---|---|---|")
            for (name, case), rows in samples.items():
                rows = rows[2:]
                print(f"| {name} | {case} | {statistics.median(r[0] for r in rows):.1f} ms | "
                      f"{statistics.median(r[1] for r in rows):.1f} ms |")
        finally:
            agent.terminate()
            agent.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
