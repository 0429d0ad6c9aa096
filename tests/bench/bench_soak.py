"""The agent through a long night on the sim node: does anything it holds grow?

Churn for --minutes (default 60): a tenant started and one SIGKILLed every few seconds (residual VRAM comes
and goes), two engines that crash every few seconds and are restarted by their shims, kernel-log lines with
findings fed through the agent's kmsg FIFO, 15 clients polling /v1/snapshot at 1 Hz, 5 following the event
stream, /metrics scraped every second. The agent's RSS, open fds, threads, CPU and its state files are read
after a warm-up and at the end; the peer is the agent itself at the start (ratios end / start), and the
same readings of an idle agent (no churn, no clients) run beside it give the baseline drift.

Run: .venv/bin/python tests/bench/bench_soak.py --minutes 60   (prints a table; RESULTS.md has the figures)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "bench"))

from benchlib import machine_line  # noqa: E402
from helpers.net import free_port  # noqa: E402

from gpuwarden.ops.agent.client import get  # noqa: E402

GW = [sys.executable, "-m", "gpuwarden"]
KERNEL_LINES = [
    "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:3 pasid:32770)",
    "python3[4242]: segfault at 8 ip 00007f0000001234 sp 00007ffd00000000 error 6 in libamdhip64.so.7[7f0000000000+400000]",
    "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!",
    "Out of memory: Killed process 4243 (python3) total-vm:1000kB, anon-rss:100kB",
]


def reading(pid: int, state: Path) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    field = {k: v.split()[0] for k, _, v in (line.partition(":") for line in status.splitlines()) if v.split()}
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    agent_dir = state / "agent"
    return {"rss_mib": int(field["VmRSS"]) / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(field["Threads"]), "cpu_s": (int(stat[11]) + int(stat[12])) / tick,
            "events_kib": sum(p.stat().st_size for p in agent_dir.glob("events*.jsonl")) / 1024,
            "trend_kib": sum(p.stat().st_size for p in agent_dir.glob("trend.jsonl")) / 1024, "t": time.monotonic()}


def start_agent(state: Path, config: Path, port: int | None) -> subprocess.Popen:
    args = [*GW, "--state-dir", str(state), "--config", str(config), "--backend", "sim", "agent", "--foreground",
            "--interval", "1"]
    if port:
        args += ["--metrics-listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(state.parent / f"{state.name}.log", "w"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = get(state / "agent.sock", "/healthz")
        if r is not None and r.status == 200 and r.json().get("ok"):
            return proc
        time.sleep(0.2)
    raise SystemExit(f"the agent in {state} did not become healthy; see {state.parent / (state.name + '.log')}")


def node(work: Path, name: str, with_engines: bool) -> tuple[Path, Path, Path]:
    state = work / name
    subprocess.run([*GW, "--state-dir", str(state), "sim", "init", "--gpus", "4", "--vram", "24GiB"], check=True,
                   capture_output=True)
    fifo = work / f"{name}.kmsg"
    os.mkfifo(fifo)
    lines = [f'[agent]\nkmsg = "{fifo}"\n']
    if with_engines:
        crash = "sleep 3; kill -SEGV $$"
        for i in range(2):
            lines += ["[[engines]]", f'name = "crashy{i}"', f"gpu = {i}", f'argv = ["sh", "-c", {json.dumps(crash)}]',
                      'restart = "on-failure"', "restart_backoff = 1.0", "restart_backoff_max = 2.0",
                      "start_limit_burst = 1000", ""]
    config = work / f"{name}.toml"
    config.write_text("\n".join(lines))
    return state, config, fifo


class Churn:
    """Everything that happens to the busy node, each in a thread, until stop()."""

    def __init__(self, state: Path, fifo: Path, port: int, clients: int = 15, streams: int = 5):
        self.state, self.fifo, self.port = state, fifo, port
        self.stop_flag = threading.Event()
        self.tenants: list[subprocess.Popen] = []
        self.counts = {"tenants": 0, "kills": 0, "kernel_lines": 0, "polls": 0, "poll_failures": 0, "scrapes": 0,
                       "scrape_failures": 0, "stream_events": 0}
        self.threads = [threading.Thread(target=self._tenants, daemon=True),
                        threading.Thread(target=self._kernel, daemon=True),
                        threading.Thread(target=self._scrape, daemon=True)]
        self.threads += [threading.Thread(target=self._poll, daemon=True) for _ in range(clients)]
        self.threads += [threading.Thread(target=self._stream, daemon=True) for _ in range(streams)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_flag.set()
        for p in self.tenants:
            p.kill()
            p.wait()

    def _tenants(self) -> None:
        rng = random.Random(1)
        while not self.stop_flag.wait(3.0):
            gpu = rng.randrange(4)
            self.tenants.append(subprocess.Popen(
                [*GW, "--state-dir", str(self.state), "sim", "hold", "--gpu", str(gpu), "--size", "1GiB"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.counts["tenants"] += 1
            if len(self.tenants) > 4:
                victim = self.tenants.pop(0)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                self.counts["kills"] += 1

    def _kernel(self) -> None:
        with open(self.fifo, "w") as f:
            n = 0
            while not self.stop_flag.wait(2.0):
                f.write(f"<3>[{time.monotonic():12.6f}] {KERNEL_LINES[n % len(KERNEL_LINES)]}\n")
                f.flush()
                n += 1
                self.counts["kernel_lines"] += 1

    def _poll(self) -> None:
        while not self.stop_flag.wait(1.0):
            r = get(self.state / "agent.sock", "/v1/snapshot", timeout=5.0)
            self.counts["polls"] += 1
            if r is None or r.status != 200:
                self.counts["poll_failures"] += 1

    def _scrape(self) -> None:
        while not self.stop_flag.wait(1.0):
            self.counts["scrapes"] += 1
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                    r.read()
            except OSError:
                self.counts["scrape_failures"] += 1

    def _stream(self) -> None:
        import socket
        while not self.stop_flag.is_set():
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5.0)
            try:
                s.connect(str(self.state / "agent.sock"))
                s.sendall(b"GET /v1/events?follow=1 HTTP/1.1\r\nHost: agent\r\n\r\n")
                while not self.stop_flag.is_set():
                    try:
                        data = s.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        break
                    self.counts["stream_events"] += data.count(b"\n")
            except OSError:
                time.sleep(1.0)
            finally:
                s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before the first reading")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-soak-"))
    busy_state, busy_cfg, busy_fifo = node(work, "busy", with_engines=True)
    idle_state, idle_cfg, idle_fifo = node(work, "idle", with_engines=False)
    port = free_port()
    busy = start_agent(busy_state, busy_cfg, port)
    idle = start_agent(idle_state, idle_cfg, None)
    idle_kmsg = open(idle_fifo, "w")  # a writer that never writes: the idle agent's watch just waits
    subprocess.run([*GW, "--state-dir", str(busy_state), "--config", str(busy_cfg), "--backend", "sim", "launch",
                    "--timeout", "30"], capture_output=True)
    churn = Churn(busy_state, busy_fifo, port)
    churn.start()
    print(machine_line())
    time.sleep(args.warmup)  # a soak: the fixed span is the measurement itself
    first = {"busy": reading(busy.pid, busy_state), "idle": reading(idle.pid, idle_state)}
    samples = [first]
    end = time.monotonic() + args.minutes * 60
    while time.monotonic() < end:
        time.sleep(min(300.0, max(1.0, end - time.monotonic())))
        samples.append({"busy": reading(busy.pid, busy_state), "idle": reading(idle.pid, idle_state)})
    last = samples[-1]
    churn.stop()
    subprocess.run([*GW, "--state-dir", str(busy_state), "engines", "stop", "--all", "--timeout", "10"],
                   capture_output=True)
    restarts = json.loads(subprocess.run([*GW, "--state-dir", str(busy_state), "--backend", "sim", "status",
                                          "--json"], capture_output=True, text=True).stdout or "{}")
    for p in (busy, idle):
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    idle_kmsg.close()
    span = last["busy"]["t"] - first["busy"]["t"]
    print(f"soak: {args.minutes:g} min after {args.warmup:g} s warm-up; churn: {json.dumps(churn.counts)}")
    print("engine restarts: " + ", ".join(f"{e['name']} {e.get('restarts')}" for e in restarts.get("engines", [])))
    print(f"{'':12} {'busy start':>11} {'busy end':>10} {'end/start':>9} {'idle start':>11} {'idle end':>9}")
    for key in ("rss_mib", "fds", "threads", "events_kib", "trend_kib"):
        b0, b1, i0, i1 = first["busy"][key], last["busy"][key], first["idle"][key], last["idle"][key]
        print(f"{key:12} {b0:11.1f} {b1:10.1f} {b1 / b0 if b0 else float('nan'):9.2f} {i0:11.1f} {i1:9.1f}")
    for who in ("busy", "idle"):
        cpu = (last[who]["cpu_s"] - first[who]["cpu_s"]) / span * 100
        print(f"cpu {who}: {cpu:.2f}% of a core over the span")
    print("rss by reading (busy): " + " ".join(f"{s['busy']['rss_mib']:.1f}" for s in samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
