"""The agent's costs on this machine, against peers measured in the same run.

1. `gpuwarden status --json`: CPU and wall of the whole process, with the agent running and without, against
   a bare `python -c pass` (and the full Typer CLI for reference). Targets: via agent <= 1.5x bare Python,
   without <= 2x bare Python on the sim node.
2. The agent at 1 s on a simulated node of 8 GPUs, 32 engines and 2,000 GPU processes, with 7 days of minute
   history loaded: CPU % of one core and RSS over WINDOW_S, next to `top -b -d 1` (a 1 Hz monitor) in the same
   run. Targets: <= 1% of a core, RSS <= 80 MiB.
3. GET /v1/snapshot latency with 10 client processes polling at 10 Hz (p50, p99), on that node and on a small
   one. Target: p99 <= 5 ms.
Run: .venv/bin/python tests/bench/bench_agent.py [--window 60] [--json-out FILE]   (about 3 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "bench"))

from agentclients import latency  # noqa: E402
from benchlib import machine, machine_line  # noqa: E402
from ops.procs import identity  # noqa: E402
from ops.sim.node import SimNode  # noqa: E402

PY = sys.executable
N_GPUS, N_ENGINES, N_PROCS = 8, 32, 2000


def child_env() -> dict[str, str]:
    # Bytecode as an installed package has it: PYTHONDONTWRITEBYTECODE (set on some dev machines) would make
    # every run compile gpuwarden's modules again.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_") and k != "PYTHONDONTWRITEBYTECODE"}
    return env


def run_cpu(cmd: list[str], runs: int) -> dict[str, float]:
    """Median CPU (user + system, children included) and wall ms of `runs` runs of cmd; exit code of the last."""
    cpu, wall, rc = [], [], 0
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(), cwd=REPO)
        _, status, ru = os.wait4(p.pid, 0)
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append((ru.ru_utime + ru.ru_stime) * 1e3)
        rc = os.waitstatus_to_exitcode(status)
    return {"cpu": statistics.median(cpu), "wall": statistics.median(wall), "wall_min": min(wall), "rc": rc}


def start_agent(state: Path, interval: float = 1.0) -> subprocess.Popen:
    log = open(state.parent / f"agent-{state.name}.log", "ab")
    p = subprocess.Popen([PY, "-m", "tui.main", "--state-dir", str(state), "--backend", "sim", "agent", "--foreground",
                          "--interval", str(interval)], stdout=log, stderr=log, env=child_env(), cwd=REPO)
    sock = state / "agent.sock"
    from ops.agent.client import get
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r = get(sock, "/healthz", timeout=2)
        if r is not None and r.status == 200:
            return p
        if p.poll() is not None:
            raise SystemExit(f"agent exited: {(state.parent / f'agent-{state.name}.log').read_text()[-2000:]}")
        time.sleep(0.2)
    raise SystemExit("agent did not become healthy")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def startup(runs: int) -> dict[str, dict[str, float]]:
    base = Path(tempfile.mkdtemp(prefix="gw-bench-agent-"))
    state = base / "small"
    SimNode(state).init(gpus=4, vram=24 << 30)
    subprocess.run([PY, "-m", "compileall", "-q", "ops", "playbooks", "tui"], cwd=REPO, env=child_env(),
                   stdout=subprocess.DEVNULL)
    status = [PY, "-m", "tui.main", "--state-dir", str(state), "--backend", "sim", "status", "--json"]
    out = {"python -c pass": run_cpu([PY, "-c", "pass"], runs),
           "status --json, no agent": run_cpu(status, runs),
           "full CLI (python -m playbooks.cli status --json)": run_cpu(
               [PY, "-m", "playbooks.cli", "--state-dir", str(state), "--backend", "sim", "status", "--json"],
               max(5, runs // 3))}
    agent = start_agent(state)
    try:
        out["status --json via agent"] = run_cpu(status, runs)
        out["latency (small node)"] = latency(state / "agent.sock", 10.0, env=child_env())
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)
    return out


def big_node(window: float) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="gw-bench-agent-big-"))
    state = base / "big"
    node = SimNode(state)
    node.init(gpus=N_GPUS, vram=192 << 30)
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(N_PROCS + N_ENGINES)]
    top = None
    try:
        node.allocate_many([(p.pid, i % N_GPUS, 64 << 20) for i, p in enumerate(sleepers[:N_PROCS])])
        for i in range(N_ENGINES):  # records as shims write them, naming live processes
            shim, engine = sleepers[N_PROCS + i], sleepers[i]
            d = state / "engines" / f"e{i:02d}"
            d.mkdir(parents=True)
            (d / "spec.json").write_text(json.dumps({"engine": {"name": f"e{i:02d}", "argv": ["x"], "gpu": i % N_GPUS}}))
            (d / "state.json").write_text(json.dumps({
                "name": f"e{i:02d}", "gpu": i % N_GPUS, "phase": "serving", "shim_pid": shim.pid,
                "shim_start": identity(shim.pid), "pid": engine.pid, "pid_start": identity(engine.pid),
                "started_at": time.time(), "restarts": 0}))
            (d / "engine.log").write_text("serving\n")
        # Seven days of minute history, as a week-old agent leaves it.
        agent_dir = state / "agent"
        agent_dir.mkdir()
        now = time.time()
        with open(agent_dir / "trend.jsonl", "w") as f:
            for m in range(7 * 24 * 60):
                t = (now // 60 - 7 * 24 * 60 + m) * 60
                f.write(json.dumps({"t": t, "gpus": {str(g): [16 << 30, 17 << 30, 0, 0] for g in range(N_GPUS)}},
                                   separators=(",", ":")) + "\n")
        agent = start_agent(state)
        top = subprocess.Popen(["top", "-b", "-d", "1"], stdout=subprocess.DEVNULL)
        try:
            time.sleep(10)  # the first deep scans and the engines' shared-file reads
            a0, t0, top0 = proc_cpu_s(agent.pid), time.monotonic(), proc_cpu_s(top.pid)
            time.sleep(window)
            a1, t1, top1 = proc_cpu_s(agent.pid), time.monotonic(), proc_cpu_s(top.pid)
            from ops.agent.client import get
            health = get(state / "agent.sock", "/healthz").json()
            snap_bytes = len(get(state / "agent.sock", "/v1/snapshot").body)
            lat = latency(state / "agent.sock", 20.0, env=child_env())
            return {"agent_cpu_pct": 100 * (a1 - a0) / (t1 - t0), "top_cpu_pct": 100 * (top1 - top0) / (t1 - t0),
                    "agent_rss_mib": rss_mib(agent.pid), "history_bytes": health["history_bytes"],
                    "snapshot_bytes": snap_bytes, "latency": lat, "window_s": window}
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(10)
    finally:
        if top is not None:
            top.kill()
            top.wait()
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="runs of each command in part 1")
    ap.add_argument("--window", type=float, default=60.0, help="seconds the agent's CPU is measured over")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    print(machine_line())
    s = startup(args.runs)
    bare = s["python -c pass"]
    print(f"1. status start-up, median of {args.runs} runs (CPU = user + system of the process)")
    for name, r in s.items():
        if "cpu" in r:
            print(f"   {name:<52} CPU {r['cpu']:6.1f} ms ({r['cpu'] / bare['cpu']:4.2f}x)   wall {r['wall']:6.1f} ms "
                  f"({r['wall'] / bare['wall']:4.2f}x)  exit {r['rc']}")
    via, alone = s["status --json via agent"], s["status --json, no agent"]
    print(f"   targets: via agent <= 1.5x bare Python: CPU {via['cpu'] / bare['cpu']:.2f}x "
          f"{'met' if via['cpu'] / bare['cpu'] <= 1.5 else 'MISSED'}; without <= 2x: CPU "
          f"{alone['cpu'] / bare['cpu']:.2f}x {'met' if alone['cpu'] / bare['cpu'] <= 2 else 'MISSED'}")
    b = big_node(args.window)
    print(f"2. agent at 1 s, {N_GPUS} GPUs, {N_ENGINES} engines, {N_PROCS} GPU processes, 7 days of history, "
          f"over {b['window_s']:.0f} s")
    print(f"   agent CPU {b['agent_cpu_pct']:.2f}% of a core (peer top -b -d 1: {b['top_cpu_pct']:.2f}%), "
          f"RSS {b['agent_rss_mib']:.1f} MiB, history rings {b['history_bytes'] / 2**20:.2f} MiB, "
          f"snapshot {b['snapshot_bytes'] / 1024:.0f} KiB")
    for label, lat in (("small node", s["latency (small node)"]), ("big node", b["latency"])):
        print(f"3. /v1/snapshot, 10 clients at 10 Hz, {label}: {lat['requests']} requests, {lat['failed']} failed, "
              f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, max {lat['max']:.1f} ms")
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine(), "startup": s, "big_node": b}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
