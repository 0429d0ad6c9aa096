"""What the checked state dir costs: the hot writers and readers, this tree against a peer (the code before).

Every open in the state dir now walks from the state dir down through checked directory fds and opens
the file with O_NOFOLLOW; this measures that walk where it is paid most: a journal line, a drained-GPU
change, a simulated driver's tree rewrite (every refresh of a sim node), the engine list of a refresh.

    python tests/bench/bench_statedir.py [--peer main] [--rounds 5]

Each operation runs in a fresh interpreter per tree, rounds alternate between the trees, medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]

WORK = r'''
import json, os, sys, time, tempfile
from pathlib import Path
from gpuwarden.ops.foundation import journal; from gpuwarden.ops.node import nodestate
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.engines import state as st
op, n = sys.argv[1], int(sys.argv[2])
state = Path(tempfile.mkdtemp()) / "state"
state.mkdir()
if op == "journal":
    t0 = time.perf_counter()
    for i in range(n):
        journal.write(state, "bench", "ok", step=i, argv=["/opt/engine", "--port", "8000"])
elif op == "drained":
    t0 = time.perf_counter()
    for i in range(n):
        nodestate.set_drained(state, i % 4, i % 2 == 0, who="bench")
        nodestate.drained(state)
elif op == "sim-sync":
    node = SimNode(state)
    node.init(gpus=4, vram=24 << 30)
    for g in range(4):
        for k in range(5):
            node.allocate(os.getpid(), g, 1 << 20)
    t0 = time.perf_counter()
    for i in range(n):
        node.sync()
elif op == "engine-list":
    for k in range(4):
        d = state / "engines" / f"e{k}"
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"name": f"e{k}", "gpu": k, "phase": "serving", "restarts": 0}))
        (d / "spec.json").write_text(json.dumps({"engine": {"name": f"e{k}", "argv": ["/bin/true"]}}))
        (d / "engine.log").write_text("serving\n")
    settings = Settings(state_dir=state)
    t0 = time.perf_counter()
    for i in range(n):
        st.list_engines(settings)
print(json.dumps((time.perf_counter() - t0) / n))
'''

OPS = {"journal": 300, "drained": 200, "sim-sync": 200, "engine-list": 500}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="main")
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-statedir-") as tmp:
        peer = benchlib.export_tree(REPO, opts.peer, Path(tmp))
        trees = {"this tree": REPO, f"peer ({opts.peer})": peer}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(opts.rounds):
            for op, n in OPS.items():
                for name, root in trees.items():
                    out = subprocess.run([sys.executable, "-c", WORK, op, str(n)], cwd=root, capture_output=True,
                                         text=True, env={**os.environ, "PYTHONPATH": str(root)}, check=True).stdout
                    times.setdefault((op, name), []).append(json.loads(out))
        names = list(trees)
        print(f"| operation | {' | '.join(names)} | ratio |")
        print("|---|---|---|---|")
        for op in OPS:
            a, b = (statistics.median(times[(op, n)]) * 1e6 for n in names)
            print(f"| {op} | {a:.0f} us | {b:.0f} us | {a / b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
