"""What one Kubernetes API call costs through gpuwarden's Kube (ops/k8s/kube.py), against the loopback API stand-in:
the calls the agent makes (get node, list its pods, patch nodes/status, a lease read and update, a watch event).

Run from a tree whose stand-in builds the client that tree ships (lightkube since issue 36's port; the official
client before), so the same file compares the two:
    python tests/bench/bench_kube_calls.py [--calls 300] [--pods 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the stand-ins

from standins.kube_apiserver import FakeApiServer  # noqa: E402

NODE = "bench-node"


def timed(fn, n: int) -> dict[str, float]:
    fn()  # connection set up and first-call imports out of the figures
    took = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        took.append((time.perf_counter() - t) * 1e3)
    took.sort()
    return {"median_ms": statistics.median(took), "p95_ms": took[int(len(took) * 0.95) - 1]}


def watch_latency(api: FakeApiServer, kube, n: int) -> dict[str, float]:
    """add_pod on the server -> the ADDED event in the reader's hands."""
    rv = kube.pods_on(NODE)["metadata"]["resourceVersion"]
    stream = kube.watch_pods(NODE, rv, 120)
    got: dict[str, float] = {}
    cond = threading.Condition()

    def read() -> None:
        for kind, obj in stream:
            if kind == "ADDED":
                with cond:
                    got[obj["metadata"]["name"]] = time.perf_counter()
                    cond.notify_all()
    threading.Thread(target=read, daemon=True).start()
    took = []
    for i in range(n):
        name = f"w{i}"
        t = time.perf_counter()
        api.add_pod("bench", name, NODE)
        with cond:
            cond.wait_for(lambda name=name: name in got, timeout=10)
        took.append((got[name] - t) * 1e3)
    stream.close()
    took.sort()
    return {"median_ms": statistics.median(took), "p95_ms": took[int(len(took) * 0.95) - 1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--pods", type=int, default=60, help="pods on the node (the list's size)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    api = FakeApiServer().start()
    try:
        api.add_node(NODE)
        for i in range(args.pods):
            api.add_pod("bench", f"p{i}", NODE, containers={"main": f"containerd://{i:064x}"})
        t = time.perf_counter()
        kube = api.kube()
        made_ms = (time.perf_counter() - t) * 1e3
        client = type(getattr(kube, "client", None) or getattr(kube, "api_client", None)).__module__
        lease = kube.create_lease("bench", {"metadata": {"name": "slot"}, "spec": {"holderIdentity": "a"}})
        state = {"lease": lease}

        def renew() -> None:
            state["lease"] = kube.update_lease("bench", {**state["lease"], "spec": {"holderIdentity": "a"}})
        cond = {"type": "GPUResidualVRAM", "status": "False", "reason": "Clean", "message": "bench"}
        out = {
            "client": client, "load": os.getloadavg(), "first_kube_ms": made_ms,
            "get node": timed(lambda: kube.node(NODE), args.calls),
            f"list {args.pods} pods on the node": timed(lambda: kube.pods_on(NODE), args.calls),
            "patch nodes/status": timed(lambda: kube.patch_node_status(NODE, {"status": {"conditions": [cond]}}),
                                        args.calls),
            "get + update a lease": timed(lambda: (kube.lease("bench", "slot"), renew()), args.calls),
            "watch: pod added -> event read": watch_latency(api, kube, min(args.calls, 100)),
        }
    finally:
        api.stop()
    print(f"client {out['client']}; load {' '.join(f'{x:.2f}' for x in out['load'])}; "
          f"first Kube {out['first_kube_ms']:.1f} ms (imports included)")
    for key, v in out.items():
        if isinstance(v, dict):
            print(f"  {key}: median {v['median_ms']:.2f} ms, p95 {v['p95_ms']:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
