"""Clients that poll the agent's /v1/snapshot at a fixed rate, each in its own process; their latencies.

Used by bench_agent.py and tests/device/agent_nvml.sh: python tests/bench/agentclients.py SOCKET SECONDS [CLIENTS]
prints {"requests", "failed", "p50", "p99", "max"} (milliseconds) as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def poll(sock: str, seconds: float, hz: float = 10.0) -> list[float]:
    """One client: GET /v1/snapshot every 1/hz s; ms per answer, -1 for a failed one."""
    sys.path.insert(0, str(REPO))
    from gpuwarden.ops.agent.client import get
    out: list[float] = []
    end = time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < end:
        t = time.perf_counter()
        r = get(sock, "/v1/snapshot")
        out.append((time.perf_counter() - t) * 1e3 if r is not None and r.status == 200 else -1.0)
        nxt += 1.0 / hz
        time.sleep(max(0.0, nxt - time.monotonic()))
    return out


def latency(sock: Path | str, seconds: float, clients: int = 10, env: dict | None = None) -> dict[str, float]:
    """`clients` processes polling at 10 Hz for `seconds`: percentiles over all their requests."""
    procs = [subprocess.Popen([sys.executable, __file__, "--one", str(sock), str(seconds)], stdout=subprocess.PIPE,
                              env=env) for _ in range(clients)]
    samples: list[float] = []
    for p in procs:
        samples += json.loads(p.communicate()[0])
    ok = sorted(s for s in samples if s >= 0)
    pick = (lambda q: ok[int(q * (len(ok) - 1))]) if ok else (lambda q: -1.0)
    return {"requests": len(samples), "failed": sum(1 for s in samples if s < 0), "p50": pick(0.5),
            "p99": pick(0.99), "max": ok[-1] if ok else -1.0}


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        print(json.dumps(poll(sys.argv[2], float(sys.argv[3]))))
    else:
        print(json.dumps(latency(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 10)))
