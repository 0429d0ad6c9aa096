"""From "14 GiB ownerless on GPU 2" to clean: `gpuwarden fix 2 --yes` against the hand-run sequence it replaces.

Peer in the same run, on the same sim node state: `drain 2 --yes && reset 2 --yes && undrain 2` (three
interpreter starts, what the old hints asked for once the drain wait was fixed), and `status --json` (one
interpreter start plus a snapshot: the floor any command pays). Each case starts from a fresh 14 GiB leak.
Run: .venv/bin/python tests/bench/bench_fix.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import benchlib  # noqa: E402
from gpuwarden.ops.node.sim.node import SimNode  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="gw-bench-fix-")) / "state"
    node = SimNode(state)
    node.init(gpus=4, vram=24 << 30)
    cli = [sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim"]

    def sh(*words: str) -> None:
        subprocess.run([*cli, *words], cwd=REPO, check=True, capture_output=True, stdin=subprocess.DEVNULL)

    def timed(setup, *commands) -> float:
        setup()
        t = time.perf_counter()
        for c in commands:
            sh(*c)
        return (time.perf_counter() - t) * 1e3

    leak = lambda: node.leak(2, 14 << 30)  # noqa: E731
    cases = {
        "fix 2 --yes": lambda: timed(leak, ("fix", "2", "--yes")),
        "peer: drain && reset && undrain": lambda: timed(leak, ("drain", "2", "--yes"), ("reset", "2", "--yes"),
                                                         ("undrain", "2")),
        "floor: status --json": lambda: timed(lambda: None, ("status", "--json")),
    }
    print(benchlib.machine_line())
    results = {}
    for _ in range(args.runs):  # interleaved, so load changes hit every case alike
        for name, fn in cases.items():
            results.setdefault(name, []).append(fn())
    fix = statistics.median(results["fix 2 --yes"])
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:<34} median {med:8.0f} ms  (min {min(values):.0f}, max {max(values):.0f})  "
              f"fix/this = {fix / med:.2f}")
    assert node.describe()["leaked"] == {}, "a case left the leak behind"


if __name__ == "__main__":
    main()
