"""The agent's costs on this machine, against peers measured in the same run.

1. `gpuwarden status --json`: CPU and wall of the whole process, with the agent running and without (on an
   idle node, and on one with 4 tenants and an engine record to show), against a bare `python -c pass` run in
   turn with them (and the full Typer CLI for reference); then `python -X importtime`: what status imports
   beyond a bare interpreter, the least of several runs per module. Targets: via agent <= 1.5x bare Python, without <= 2x
   bare Python on the sim node.
2. The agent at 1 s on a simulated node of 8 GPUs, 32 engines and 2,000 GPU processes, with 7 days of minute
   history loaded: CPU % of one core and RSS over WINDOW_S, next to `top -b -d 1` (a 1 Hz monitor) in the same
   run. Targets: <= 1% of a core, RSS <= 80 MiB.
3. GET /v1/snapshot latency with 10 client processes polling at 10 Hz (p50, p99), on that node and on a small
   one. Target: p99 <= 5 ms.
Run: .venv/bin/python tests/bench/bench_agent.py [--window 60] [--json-out FILE]   (about 4 minutes)
     .venv/bin/python tests/bench/bench_agent.py --startup-only   (part 1 alone, about 1 minute)
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
from benchlib import export_tree, machine, machine_line  # noqa: E402
from gpuwarden.ops.node.procs import identity  # noqa: E402
from gpuwarden.ops.node.sim.node import SimNode  # noqa: E402

PY = sys.executable
N_GPUS, N_ENGINES, N_PROCS = 8, 32, 2000


def child_env() -> dict[str, str]:
    # Bytecode as an installed package has it: PYTHONDONTWRITEBYTECODE (set on some dev machines) would make
    # every run compile gpuwarden's modules again.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_") and k != "PYTHONDONTWRITEBYTECODE"}
    return env


def run_cpu(cmds: dict[str, list[str]], runs: int, cwd: dict[str, Path] | None = None) -> dict[str, dict[str, float]]:
    """Median CPU (user + system) and wall ms of `runs` runs of each command (in the repo, or in cwd[name]), taken
    in turn so that the load of a shared machine drifts over all of them alike; exit code of each one's last run."""
    cpu: dict[str, list[float]] = {k: [] for k in cmds}
    wall: dict[str, list[float]] = {k: [] for k in cmds}
    rc: dict[str, int] = {}
    for _ in range(runs):
        for name, cmd in cmds.items():
            t = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                                 cwd=(cwd or {}).get(name, REPO))
            _, status, ru = os.wait4(p.pid, 0)
            wall[name].append((time.perf_counter() - t) * 1e3)
            cpu[name].append((ru.ru_utime + ru.ru_stime) * 1e3)
            rc[name] = os.waitstatus_to_exitcode(status)
    return {k: {"cpu": statistics.median(cpu[k]), "wall": statistics.median(wall[k]), "wall_min": min(wall[k]),
                "rc": rc[k]} for k in cmds}


def import_costs(cmd: list[str], runs: int) -> dict[str, int]:
    """Self import time (us) of each module `cmd` imports, the least of `runs` runs (python -X importtime)."""
    best: dict[str, int] = {}
    for _ in range(runs):
        p = subprocess.run([PY, "-X", "importtime", *cmd], capture_output=True, text=True, env=child_env(), cwd=REPO)
        for line in p.stderr.splitlines():
            if line.startswith("import time:") and "self [us]" not in line:
                us, _, name = line[len("import time:"):].split("|")
                best[name.strip()] = min(int(us), best.get(name.strip(), 1 << 62))
    return best


def hold_tenants(state: Path, gpus: int) -> list[subprocess.Popen]:
    """One simulated tenant per GPU (real processes holding VRAM and device files), ready when this returns."""
    tenants = []
    for g in range(gpus):
        p = subprocess.Popen([PY, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "sim", "hold", "--gpu", str(g),
                              "--size", "1GiB"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env=child_env(), cwd=REPO)
        tenants.append(p)
        if not p.stdout.readline().startswith(b"holding"):  # type: ignore[union-attr]
            raise SystemExit(f"sim tenant on GPU {g} did not start")
    return tenants


def start_agent(state: Path, interval: float = 1.0, env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(state.parent / f"agent-{state.name}.log", "ab")
    p = subprocess.Popen([PY, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim", "agent", "--foreground",
                          "--interval", str(interval)], stdout=log, stderr=log, env=env or child_env(),
                         cwd=REPO if env is None else state.parent)
    sock = state / "agent.sock"
    from gpuwarden.ops.agent.client import get
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


def startup(runs: int, before: str | None = None) -> dict[str, dict]:
    base = Path(tempfile.mkdtemp(prefix="gw-bench-agent-"))
    state, busy = base / "small", base / "busy"
    SimNode(state).init(gpus=4, vram=24 << 30)
    SimNode(busy).init(gpus=4, vram=24 << 30)
    subprocess.run([PY, "-m", "compileall", "-q", "ops", "playbooks", "tui"], cwd=REPO, env=child_env(),
                   stdout=subprocess.DEVNULL)
    status = [PY, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim", "status", "--json"]
    cmds = {"python -c pass": [PY, "-c", "pass"], "status --json, no agent": status,
            "status --json, no agent, 4 tenants + 1 engine": [
                PY, "-m", "gpuwarden.tui.main", "--state-dir", str(busy), "--backend", "sim", "status", "--json"]}
    cwd = {}
    if before:  # the same command from another commit's tree (python -m finds the current directory's first)
        peer = export_tree(REPO, before, base)
        subprocess.run([PY, "-m", "compileall", "-q", "ops", "playbooks", "tui"], cwd=peer, env=child_env(),
                       stdout=subprocess.DEVNULL)
        for label, cmd in list(cmds.items())[1:]:
            cmds[f"{label}, at {before}"], cwd[f"{label}, at {before}"] = cmd, peer
    tenants = hold_tenants(busy, 4)
    engine = subprocess.Popen(["sleep", "3600"])  # an engine record's shim and engine, as a shim writes it
    tenants.append(engine)
    d = busy / "engines" / "e0"
    d.mkdir(parents=True)
    (d / "spec.json").write_text(json.dumps({"engine": {"name": "e0", "argv": ["x"], "gpu": 0}}))
    (d / "state.json").write_text(json.dumps({
        "name": "e0", "gpu": 0, "phase": "serving", "shim_pid": engine.pid, "shim_start": identity(engine.pid),
        "pid": engine.pid, "pid_start": identity(engine.pid), "started_at": time.time(), "restarts": 0,
        "registrations": [{"kind": "register", "outcome": "registered", "bytes": 1 << 30, "started_at": time.time()}]}))
    try:
        out: dict[str, dict] = run_cpu(cmds, runs, cwd)
        out["imports"] = {"status": import_costs(status[1:], 10), "bare": import_costs(["-c", "pass"], 10)}
    finally:
        for p in tenants:
            p.terminate()
        for p in tenants:
            p.wait(10)
    out.update({f"{k} (full-CLI block)": v for k, v in run_cpu({
        "python -c pass": [PY, "-c", "pass"],
        "full CLI (python -m gpuwarden.playbooks.cli.root status --json)": [
            PY, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state), "--backend", "sim", "status", "--json"]},
        max(5, runs // 3)).items()})
    agent = start_agent(state)
    try:
        out.update({f"{k} (agent block)": v for k, v in run_cpu({"python -c pass": [PY, "-c", "pass"],
                                                                   "status --json via agent": status}, runs).items()})
        out["latency (small node)"] = latency(state / "agent.sock", 10.0, env=child_env())
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)
    return out


def print_startup(s: dict[str, dict], runs: int) -> None:
    print(f"1. status start-up, median of {runs} runs each, in turn with bare python (CPU = user + system)")
    bare = s["python -c pass"]
    for name, r in s.items():
        if "cpu" not in r:
            continue
        block = name[name.rindex("("):] if name.endswith("block)") else ""
        peer = s[f"python -c pass {block}".strip()]
        print(f"   {name:<62} CPU {r['cpu']:6.1f} ms ({r['cpu'] / peer['cpu']:4.2f}x)   wall {r['wall']:6.1f} ms "
              f"({r['wall'] / peer['wall']:4.2f}x)  exit {r['rc']}")
    via = s["status --json via agent (agent block)"]["cpu"] / s["python -c pass (agent block)"]["cpu"]
    alone = s["status --json, no agent"]["cpu"] / bare["cpu"]
    busy = s["status --json, no agent, 4 tenants + 1 engine"]["cpu"] / bare["cpu"]
    print(f"   targets: via agent <= 1.5x bare Python: CPU {via:.2f}x {'met' if via <= 1.5 else 'MISSED'}; "
          f"without <= 2x: CPU {alone:.2f}x {'met' if alone <= 2 else 'MISSED'} "
          f"(4 tenants + 1 engine: {busy:.2f}x {'met' if busy <= 2 else 'MISSED'})")
    imports, bare_names = s["imports"]["status"], s["imports"]["bare"]
    extra = sorted(((us, n) for n, us in imports.items() if n not in bare_names), reverse=True)
    print(f"   imports beyond bare python (least self time of 10 runs): {sum(us for us, _ in extra) / 1e3:.1f} ms "
          f"in {len(extra)} modules; the largest: " + ", ".join(f"{n} {us / 1e3:.2f}" for us, n in extra[:12]))


def big_node(window: float, peer: str | None = None) -> dict[str, object]:
    """Part 2 and 3 on the big node: {tree label: figures}; with `peer`, that git ref's agent too, after this one."""
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
        trees: list[tuple[str, dict[str, str] | None]] = [("this tree", None)]
        if peer is not None:
            import benchlib
            tmp = Path(tempfile.mkdtemp(prefix="gw-bench-agent-peer-"))
            trees.append((f"peer ({peer})", {**child_env(), **benchlib.linked_env(
                export_tree(REPO, peer, tmp), tmp / "pkgs")}))
        out: dict[str, object] = {}
        top = subprocess.Popen(["top", "-b", "-d", "1"], stdout=subprocess.DEVNULL)
        for label, env in trees:  # one after the other on the same node, each agent alone
            agent = start_agent(state, env=env)
            try:
                time.sleep(10)  # the first deep scans and the engines' shared-file reads
                a0, t0, top0 = proc_cpu_s(agent.pid), time.monotonic(), proc_cpu_s(top.pid)
                time.sleep(window)
                a1, t1, top1 = proc_cpu_s(agent.pid), time.monotonic(), proc_cpu_s(top.pid)
                from gpuwarden.ops.agent.client import get
                health = get(state / "agent.sock", "/healthz").json()
                snap_bytes = len(get(state / "agent.sock", "/v1/snapshot").body)
                lat = latency(state / "agent.sock", 20.0, env=child_env())
                out[label] = {"agent_cpu_pct": 100 * (a1 - a0) / (t1 - t0),
                              "top_cpu_pct": 100 * (top1 - top0) / (t1 - t0), "agent_rss_mib": rss_mib(agent.pid),
                              "history_bytes": health["history_bytes"], "snapshot_bytes": snap_bytes, "latency": lat,
                              "window_s": window}
            finally:
                agent.send_signal(signal.SIGTERM)
                agent.wait(10)
        return out
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
    ap.add_argument("--startup-only", action="store_true", help="part 1 alone (status start-up and its imports)")
    ap.add_argument("--before", metavar="REF", help="also time status at this commit (e.g. main), in the same turns")
    ap.add_argument("--big-only", action="store_true", help="parts 2 and 3 on the big node alone")
    ap.add_argument("--peer", metavar="REF", help="also run this commit's agent on the big node (after this tree's)")
    args = ap.parse_args()
    print(machine_line())
    s = startup(args.runs, args.before) if not args.big_only else {}
    if s:
        print_startup(s, args.runs)
    if args.startup_only:
        if args.json_out:
            args.json_out.write_text(json.dumps({"machine": machine(), "startup": s}, indent=2) + "\n")
        return 0
    trees = big_node(args.window, args.peer)
    for tree, b in trees.items():
        assert isinstance(b, dict)
        print(f"2. agent at 1 s ({tree}), {N_GPUS} GPUs, {N_ENGINES} engines, {N_PROCS} GPU processes, 7 days of "
              f"history, over {b['window_s']:.0f} s")
        print(f"   agent CPU {b['agent_cpu_pct']:.2f}% of a core (peer top -b -d 1: {b['top_cpu_pct']:.2f}%), "
              f"RSS {b['agent_rss_mib']:.1f} MiB, history rings {b['history_bytes'] / 2**20:.2f} MiB, "
              f"snapshot {b['snapshot_bytes'] / 1024:.0f} KiB")
        lats = ([("small node", s["latency (small node)"])] if s else []) + [(f"big node, {tree}", b["latency"])]
        for label, lat in lats:
            print(f"3. /v1/snapshot, 10 clients at 10 Hz, {label}: {lat['requests']} requests, {lat['failed']} "
                  f"failed, p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, max {lat['max']:.1f} ms")
    b = trees
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine(), "startup": s, "big_node": b}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
