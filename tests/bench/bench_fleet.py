"""The fleet over 16 loopback sshd nodes: `fleet status` against pdsh and clush running the same command on the
same hosts in the same run; a black-holed host against the per-host timeout; the fleet console's CPU at 1 Hz;
with an agent on every node and a real Prometheus scraping them, `fleet status --prometheus` against the same
command over SSH, and the console's CPU with --prometheus.

Run: `python tests/bench/bench_fleet.py [--runs 5] [--tui-seconds 20] [--parts ssh,hole,tui,prometheus]`
(needs sshd, pdsh, clush, tmux; prometheus for that part).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import benchlib  # noqa: E402
from helpers.sshfleet import SshFleet, black_hole, client_env, init_all  # noqa: E402

GPUWARDEN = Path(sys.executable).parent / "gpuwarden"
TICKS = os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], env: dict[str, str], expect: int | None = None, inner: list | None = None) -> float:
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t
    if expect is not None and proc.returncode != expect:
        raise SystemExit(f"{argv[0]} exited {proc.returncode}: {proc.stderr[-800:]}")
    if inner is not None:  # the fan-out alone, as the command measured it (no interpreter start)
        inner.append(json.loads(proc.stdout)["duration_s"])
    return took


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--tui-seconds", type=float, default=20.0)
    ap.add_argument("--parts", default="ssh,hole,tui,prometheus",
                    help="which measurements, comma-separated: ssh (vs pdsh/clush), hole, tui, prometheus")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    for tool in ("pdsh", "clush", "tmux", *(("prometheus",) if "prometheus" in parts else ())):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed for this benchmark (apt-get install pdsh clustershell tmux)")
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    root.chmod(0o755)
    fleet = SshFleet(root, getpass.getuser())
    names = [f"gpu{i:02d}" for i in range(1, args.nodes + 1)]
    nodelist = f"gpu[01-{args.nodes:02d}]"
    hole_port, hole_close = black_hole()
    try:
        fleet.start(names)
        init_all(fleet.nodes, "--gpus", "8", "--vram", "192GiB")
        fleet.write_client_files(f"Host hole\n  HostName 127.0.0.1\n  Port {hole_port}\n")
        env = {**os.environ, **client_env(fleet)}
        cfg = str(fleet.ssh_config)
        remote = "gpuwarden status --json"
        ours = [str(GPUWARDEN), "fleet", "status", "--json", "--nodelist", nodelist, "--ssh-config", cfg,
                "--parallel", "32", "--timeout", "30"]
        pdsh = ["pdsh", "-R", "ssh", "-f", "32", "-w", nodelist, remote]
        clush = ["clush", "-f", "32", "-o", f"-F {cfg}", "-w", nodelist, remote]
        penv = {**env, "PDSH_SSH_ARGS": f"-F {cfg} -x -oConnectTimeout=30 -l %u %h"}
        report: dict = {"machine": benchlib.machine(), "load": benchlib.load()}
        print(benchlib.machine_line())
        if "ssh" in parts:
            samples: dict[str, list[float]] = {"gpuwarden fleet status": [], "pdsh -R ssh": [], "clush": []}
            timed(ours, env)  # warm the page cache and every sshd once
            for _ in range(args.runs):  # interleaved, so load from other work hits all three alike
                samples["gpuwarden fleet status"].append(timed(ours, env, expect=0))
                samples["pdsh -R ssh"].append(timed(pdsh, penv, expect=0))
                samples["clush"].append(timed(clush, env, expect=0))
            med = {k: statistics.median(v) for k, v in samples.items()}
            best_peer = min(med["pdsh -R ssh"], med["clush"])
            print(f"fleet status over {args.nodes} loopback sshd nodes (8 sim GPUs each), median of {args.runs}:")
            for k, v in med.items():
                print(f"  {k:<24} {v:6.2f} s   ({', '.join(f'{x:.2f}' for x in samples[k])})")
            print(f"  ratio gpuwarden / best peer = {med['gpuwarden fleet status'] / best_peer:.2f} (target <= 1.5)")
            report.update(medians_s=med, samples_s=samples)

        if "hole" in parts:
            hole = [str(GPUWARDEN), "fleet", "status", "--json", "--nodelist", nodelist + ",hole", "--ssh-config",
                    cfg, "--timeout", f"{args.timeout:g}"]
            hole_inner: list[float] = []
            hole_times = [timed(hole, env, expect=2, inner=hole_inner) for _ in range(3)]
            print(f"black-holed host, --timeout {args.timeout:g}: whole command "
                  f"{', '.join(f'{x:.2f}' for x in hole_times)} s; fan-out {', '.join(f'{x:.2f}' for x in hole_inner)}"
                  f" s (target <= {args.timeout + 1:g} s)")
            report.update(black_hole_s=hole_times, black_hole_fanout_s=hole_inner)

        if "tui" in parts:
            tui = measure_tui(fleet, env, nodelist, args.tui_seconds, root)
            for k, v in tui.items():
                print(f"fleet tui at 1 Hz over {args.nodes} nodes, {k}: {v:.1f}% of one core (target <= 5%)")
            report.update(tui_cpu_percent=tui)

        if "prometheus" in parts:
            report.update(prometheus=measure_prometheus(fleet, env, nodelist, ours, args, root))
        report["load_after"] = benchlib.load()
        print(json.dumps(report))
    finally:
        hole_close()
        fleet.stop()
        shutil.rmtree(root, ignore_errors=True)


def measure_prometheus(fleet: SshFleet, env: dict[str, str], nodelist: str, ours: list[str], args,
                       root: Path) -> dict:
    """An agent exporting metrics on every node, a real Prometheus scraping them every 5 s under instance = the
    node's name: `fleet status --prometheus` (every row from Prometheus) against `fleet status` over SSH (each
    node's status answered by its agent), interleaved; then the console with --prometheus."""
    from helpers.fleet_prometheus import start_exporting_agent
    from helpers.metrics_e2e import Prom
    agents, targets = [], {}
    prom = None
    try:
        for node in fleet.nodes:
            agent, targets[node.name] = start_exporting_agent(node, interval="5")
            agents.append(agent)
        (root / "prom").mkdir()
        prom = Prom(root / "prom", targets, scrape_interval="5s")
        deadline = time.monotonic() + 60
        while (prom.value("count(gpuwarden_agent_info)") or 0) < len(fleet.nodes):
            if time.monotonic() > deadline:
                raise SystemExit("Prometheus did not scrape every agent within 60 s")
            time.sleep(0.5)
        with_prom = [*ours, "--prometheus", prom.url]
        timed(with_prom, env)
        timed(ours, env)
        samples: dict[str, list[float]] = {"fleet status --prometheus": [], "fleet status (ssh, agents)": []}
        inner: dict[str, list[float]] = {k: [] for k in samples}
        for _ in range(args.runs):
            samples["fleet status --prometheus"].append(
                timed(with_prom, env, expect=0, inner=inner["fleet status --prometheus"]))
            samples["fleet status (ssh, agents)"].append(
                timed(ours, env, expect=0, inner=inner["fleet status (ssh, agents)"]))
        check = json.loads(subprocess.run(with_prom, env=env, capture_output=True, text=True, timeout=120).stdout)
        if check["sources"]["prometheus"] != len(fleet.nodes):
            raise SystemExit(f"not every row came from Prometheus: {check['sources']}")
        med = {k: statistics.median(v) for k, v in samples.items()}
        med_inner = {k: statistics.median(v) for k, v in inner.items()}
        print(f"with an agent on each node and Prometheus scraping them, median of {args.runs}:")
        for k, v in med.items():
            print(f"  {k:<28} {v:6.2f} s whole command, {med_inner[k]:.3f} s reading the fleet  "
                  f"({', '.join(f'{x:.2f}' for x in samples[k])})")
        tui = measure_tui(fleet, env, nodelist, args.tui_seconds, root, extra=f"--prometheus {prom.url}",
                          labels=("fleet screen (--prometheus)", "one node's console open (--prometheus)"))
        for k, v in tui.items():
            print(f"fleet tui at 1 Hz over {len(fleet.nodes)} nodes, {k}: {v:.1f}% of one core")
        return {"medians_s": med, "samples_s": samples, "reading_s": inner, "tui_cpu_percent": tui}
    finally:
        if prom is not None:
            prom.stop()
        for agent in agents:
            agent.stop()


def measure_tui(fleet: SshFleet, env: dict[str, str], nodelist: str, seconds: float, root: Path, extra: str = "",
                labels: tuple[str, str] = ("fleet screen", "one node's console open")) -> dict[str, float]:
    """CPU of the console process itself, over `seconds`, on the fleet screen and with one node's console open."""
    sock = root / "tmux.sock"
    tmux = ["tmux", "-S", str(sock)]
    cmd = f"{GPUWARDEN} --state-dir {root / 'local'} fleet tui --nodelist '{nodelist}' --refresh 1 {extra}"
    subprocess.run([*tmux, "new-session", "-d", "-x", "140", "-y", "40", "-s", "b", "-e", f"HOME={env['HOME']}",
                    "-e", "COLUMNS=140", "-e", "LINES=40", cmd], check=True)
    try:
        pid = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True).stdout
            if screen.count("SIMULATED") >= len(fleet.nodes):
                break
            time.sleep(0.2)
        out = subprocess.run(["pgrep", "-f", "fleet tui --nodelist"], capture_output=True, text=True).stdout.split()
        # tmux starts it through `sh -c`: the console is the one running Python.
        pid = next(int(p) for p in out if "python" in os.path.basename(os.readlink(f"/proc/{p}/exe")))
        time.sleep(3)  # every stream has settled into its 1 Hz rhythm
        result = {}
        for label in labels:
            if label.startswith("one"):
                subprocess.run([*tmux, "send-keys", "-t", "b", "Enter"], check=True)
                time.sleep(3)
            c0, t0 = cpu_seconds(pid), time.monotonic()
            time.sleep(seconds)
            result[label] = 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        return result
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


if __name__ == "__main__":
    main()
