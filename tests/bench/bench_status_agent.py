"""What `status --json` costs when the agent answers it: this tree against a peer (a git ref), same run, runs interleaved.

Each tree runs its own agent on its own 2-GPU sim node (--interval 5, so its sampling barely competes); the figures
are the median wall time and child CPU (user+sys) of `status --json`, and the modules it loads (gpuwarden's and
all), from `-X importtime`. This is the path scripts and monitors poll: ops/sources/choose.raw.

    python tests/bench/bench_status_agent.py [--peer main] [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall ms, child CPU ms and stdout of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60).stdout
    wall = (time.perf_counter() - t) * 1e3
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1e3, out


def modules(argv: list[str], env: dict[str, str]) -> tuple[int, int]:
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True,
                          timeout=60)
    names = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    names = [n for n in names if n != "package"]  # importtime's header line
    return sum(1 for n in names if n.startswith("gpuwarden")), len(names)


def answered_by_agent(out: str) -> bool:
    try:
        return bool(json.loads(out).get("agent"))
    except ValueError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="main")
    ap.add_argument("--runs", type=int, default=30)
    opts = ap.parse_args()
    print(benchlib.machine_line())
    agents: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-status-agent-") as tmp:
        tmp_path = Path(tmp)
        setups = {}
        try:
            for i, (name, tree) in enumerate(benchlib.compared_trees(REPO, opts.peer, tmp_path).items()):
                env = benchlib.linked_env(tree, tmp_path / f"pkgs-{i}")
                base = [sys.executable, "-m", "gpuwarden", "--state-dir", str(tmp_path / f"s{i}"), "--backend", "sim"]
                subprocess.run([*base, "sim", "init", "--gpus", "2"], env=env, check=True, capture_output=True)
                agents.append(subprocess.Popen([*base, "agent", "--foreground", "--interval", "5"], env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                argv = [*base, "status", "--json"]
                deadline = time.monotonic() + 60
                while not answered_by_agent(once(argv, env)[2]):  # the agent's first snapshot
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{name}: its agent never answered status --json")
                    time.sleep(0.2)
                setups[name] = (argv, env)
            walls: dict[str, list[float]] = {n: [] for n in setups}
            cpus: dict[str, list[float]] = {n: [] for n in setups}
            for _ in range(opts.runs + 2):  # the first two warm the page cache: dropped
                for name, (argv, env) in setups.items():
                    wall, cpu, out = once(argv, env)
                    assert answered_by_agent(out), (name, out[:200])
                    walls[name].append(wall)
                    cpus[name].append(cpu)
            print(f"`status --json` answered by the agent, medians of {opts.runs} runs, interleaved")
            print("| tree | wall | CPU (user+sys) | gpuwarden modules | all modules |")
            print("|---|---|---|---|---|")
            for name, (argv, env) in setups.items():
                ours, every = modules(argv, env)
                print(f"| {name} | {statistics.median(walls[name][2:]):.1f} ms | "
                      f"{statistics.median(cpus[name][2:]):.1f} ms | {ours} | {every} |")
        finally:
            for agent in agents:
                agent.terminate()
                agent.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
