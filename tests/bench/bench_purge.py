"""What purge's safety costs, against an unchecked kill measured in the same run, plus purge end to end.

1. Reaper.handle on N live processes (identity re-check before each signal, a journal line per signal,
   wait until gone) against a plain os.kill + wait-until-gone loop over N processes like them.
2. `gpuwarden purge --yes` on a sim node with Z zombie tenants (careless parents), interpreter start
   included, against `status --json` on the same node (the snapshot alone).
Run: .venv/bin/python tests/bench/bench_purge.py [--n 40] [--zombies 4]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from gpuwarden.ops.node import procs  # noqa: E402
from gpuwarden.ops.clean.reaper import Reaper, Target  # noqa: E402
from gpuwarden.ops.foundation.settings import Settings  # noqa: E402
from helpers.reaper_family import FAMILY, start_family  # noqa: E402

# A subreaper that starts N sleepers, prints their pids, and reaps whatever exits.
KEEPER = r'''
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
kids = [subprocess.Popen(["sleep", "600"]) for _ in range(int(sys.argv[1]))]
print(" ".join(str(k.pid) for k in kids), flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.01)
'''


def sleepers(n: int) -> tuple[subprocess.Popen, list[int]]:
    keeper = subprocess.Popen([sys.executable, "-c", KEEPER, str(n)], stdout=subprocess.PIPE, text=True)
    return keeper, [int(x) for x in keeper.stdout.readline().split()]


def gone(pid: int, ticks: int) -> bool:
    return procs.identity(pid) != ticks


def bench_reaper(n: int) -> tuple[float, float]:
    keeper, pids = sleepers(n)
    ids = [(p, procs.identity(p)) for p in pids]
    t = time.perf_counter()
    for pid, ticks in ids:
        os.kill(pid, signal.SIGTERM)
        while not gone(pid, ticks):
            time.sleep(0.001)
    naive = time.perf_counter() - t
    keeper.kill()
    keeper.wait()

    keeper, pids = sleepers(n)
    with tempfile.TemporaryDirectory() as d:
        reaper = Reaper(Settings(state_dir=Path(d)), grace_s=5.0)
        ids = [(p, procs.identity(p)) for p in pids]
        t = time.perf_counter()
        for pid, ticks in ids:
            out = reaper.handle(Target(pid, ticks, "dead-tenant"))
            assert out.result == "removed", out
        checked = time.perf_counter() - t
    keeper.kill()
    keeper.wait()
    return naive, checked


def cli(state: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", state, "--backend", "sim", *args],
                          cwd=REPO, capture_output=True, text=True)


def bench_purge(zombies: int) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as state:
        cli(state, "sim", "init", "--gpus", "8")
        fams = []
        for i in range(zombies):
            argv = [sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", state, "--backend", "sim",
                    "sim", "hold", "--gpu", str(i % 8), "--size", "1GiB"]
            fams.append(start_family(argv))
        allocs = Path(state) / "sim" / "allocs"
        deadline = time.monotonic() + 30
        while len(list(allocs.glob("*.json"))) < zombies and time.monotonic() < deadline:
            time.sleep(0.05)
        for f in fams:
            os.kill(f.tenant, signal.SIGKILL)
        time.sleep(0.3)
        t = time.perf_counter()
        cli(state, "status", "--json")
        status_s = time.perf_counter() - t
        t = time.perf_counter()
        proc = cli(state, "purge", "--yes", "--grace", "2")
        purge_s = time.perf_counter() - t
        snap = json.loads(cli(state, "status", "--json").stdout)
        left = sum(max(r["residual"] or 0, 0) for r in snap["residual"])
        for f in fams:
            f.stop()
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr)
        return status_s, purge_s, left


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--zombies", type=int, default=4)
    a = ap.parse_args()
    assert FAMILY
    naive, checked = bench_reaper(a.n)
    print(f"reaper, {a.n} live processes: unchecked kill+wait {naive * 1e3 / a.n:.2f} ms each, "
          f"Reaper.handle {checked * 1e3 / a.n:.2f} ms each, ratio {checked / naive:.2f}")
    status_s, purge_s, left = bench_purge(a.zombies)
    print(f"purge of {a.zombies} zombie tenants (sim, CLI): {purge_s:.2f} s, status --json {status_s:.2f} s, "
          f"ratio {purge_s / status_s:.1f}; residual left {left} bytes")


if __name__ == "__main__":
    main()
