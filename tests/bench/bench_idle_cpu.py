"""The agent and the console at 1 s on the stand-in NVML node, against a peer commit's, alternating in the same run:
CPU ms per second (every thread's schedstat), idle and with a busy process whose utilisation call is dear.

What a GPU machine measures against nvitop and dmon (tests/device/) this measures against gpuwarden itself, here:
    python tests/bench/bench_idle_cpu.py --peer HEAD~3 [--window 40] [--rounds 2] [--only agent|console] [--reader 20]
--reader S: a client reads the agent's /v1/snapshot every S seconds meanwhile (per-process GPU% then has a reader).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]
NODE = Path(__file__).resolve().parent / "standin_nvml_node.py"


def cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except OSError:
            pass  # a thread that ended meanwhile
    return total


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise SystemExit(f"bench: {what} did not happen within {timeout:g} s")


def agent_pid(env: dict[str, str], state: Path, cwd: Path) -> tuple[int, callable]:
    p = subprocess.Popen([sys.executable, str(NODE), "--backend", "nvml", "agent", "--foreground", "--interval", "1"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    wait_for(lambda: (state / "agent.sock").exists(), 60, "the agent's socket")

    def stop() -> None:
        p.terminate()
        p.wait(10)
    return p.pid, stop


def read_every(sock: Path, every: float, stop: threading.Event) -> None:
    """GET /v1/snapshot every `every` s until stopped: a reader of per-process GPU% (the agent's own client)."""
    from gpuwarden.ops.agent.client import get
    while not stop.wait(every):
        get(sock, "/v1/snapshot")


def console_pid(env: dict[str, str], state: Path, cwd: Path) -> tuple[int, callable]:
    sock = state / "tmux.sock"
    envs = [f"{k}={v}" for k, v in env.items() if k.startswith(("PYTHONPATH", "BUSY", "DEAR_MS", "GPUWARDEN_",
                                                                   "XDG_"))]
    cmd = " ".join(["env", *envs, sys.executable, str(NODE), "--backend", "nvml", "tui", "--refresh", "1;", "sleep",
                    "0"])
    subprocess.run(["tmux", "-S", str(sock), "new-session", "-d", "-s", "gw", "-x", "160", "-y", "48", cmd],
                   check=True, cwd=cwd)

    def child() -> int | None:
        pane = subprocess.run(["tmux", "-S", str(sock), "list-panes", "-t", "gw:", "-F", "#{pane_pid}"],
                              capture_output=True, text=True).stdout.split()
        kids = subprocess.run(["pgrep", "-P", pane[0]], capture_output=True, text=True).stdout.split() if pane else []
        return int(kids[0]) if kids else None
    pid = wait_for(child, 30, "the console's process")

    def stop() -> None:
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True)
    return pid, stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", required=True, metavar="REF", help="the commit to compare with (e.g. HEAD~3)")
    ap.add_argument("--window", type=float, default=40.0, help="seconds each run is measured over")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating")
    ap.add_argument("--only", choices=("agent", "console"))
    ap.add_argument("--reader", type=float, default=0.0, help="an agent client reads /v1/snapshot every S s")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-idle-"))
    trees = {"this tree": benchlib.linked_env(REPO, tmp / "this"),
             f"peer ({args.peer})": benchlib.linked_env(benchlib.export_tree(REPO, args.peer, tmp), tmp / "pkgs")}
    print(benchlib.machine_line(), flush=True)
    for what, start in (("agent", agent_pid), ("console", console_pid)):
        if args.only not in (None, what):
            continue
        for busy in ("0", "1"):
            got: dict[str, list[float]] = {label: [] for label in trees}
            for _ in range(args.rounds):
                for label, tree_env in trees.items():
                    state = Path(tempfile.mkdtemp(prefix="s", dir=tmp))
                    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
                    env.pop("PYTHONDONTWRITEBYTECODE", None)
                    env.update(tree_env, BUSY=busy, DEAR_MS="1.5", GPUWARDEN_STATE_DIR=str(state),
                               XDG_CONFIG_HOME=str(state / "xdg"))
                    pid, stop = start(env, state, tmp)
                    done = threading.Event()
                    if args.reader and what == "agent":
                        threading.Thread(target=read_every, args=(state / "agent.sock", args.reader, done),
                                         daemon=True).start()
                    try:
                        time.sleep(8)  # start-up, the first deep scan and the first utilisation passes
                        a, t0 = cpu_ns(pid), time.monotonic()
                        time.sleep(args.window)
                        b, t1 = cpu_ns(pid), time.monotonic()
                    finally:
                        done.set()
                        stop()
                    got[label].append((b - a) / 1e6 / (t1 - t0))
            means = {label: sum(v) / len(v) for label, v in got.items()}
            this, peer = means.values()
            runs = "; ".join(f"{label} {m:.2f} ms/s ({', '.join(f'{x:.2f}' for x in got[label])})"
                             for label, m in means.items())
            print(f"{what:8s} {'busy' if busy == '1' else 'idle'}: {runs}; ratio {this / peer:.2f}", flush=True)


if __name__ == "__main__":
    main()
