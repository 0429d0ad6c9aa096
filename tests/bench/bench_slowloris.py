"""How long an honest /healthz waits while a slowloris crowd reconnects against the agent: this tree against a
peer (a git ref), each a real agent on its own sim node, rounds interleaved, optionally under a CPU hog.

The crowd is 150 unix-socket connections that send a request line, then one header line a second, and reconnect
as soon as they are dropped (the agent takes 64). The probe asks /healthz in a loop with a 2 s timeout; the
figures are its latencies, an unanswered probe counted as 2 s (a unix connect to a full listen queue fails at
once with EAGAIN: that is unanswered too, as it is for gpuwarden's own clients). With --hog, the agents run at nice 10 while
`nproc` spinning processes hold every core at nice 0, as the CI box is when other work keeps it busy.

With --mode pipeline (issue 39, item 4) the crowd is 200 connections that each send 50 pipelined GETs at once,
never read an answer, and reconnect every 2.5 s; /healthz is probed every 0.2 s and each probe's outcome is
counted (200, 503, reset, broken pipe, unanswered).

    python tests/bench/bench_slowloris.py [--peer 3cb1d6c] [--rounds 4] [--seconds 7] [--hog]
    python tests/bench/bench_slowloris.py --mode pipeline [--peer 20b93a9] [--rounds 2] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]
CROWD = 150
PROBE_TIMEOUT_S = 2.0


class Crowd:
    """CROWD connections that never finish their request, reopened as fast as the agent drops them."""

    def __init__(self, sock_path: Path):
        self.sock_path = str(sock_path)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.socks: list[socket.socket] = []

    def _open(self) -> socket.socket | None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(self.sock_path)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            return s
        except OSError:
            s.close()
            return None

    def _run(self) -> None:
        self.socks = [s for s in (self._open() for _ in range(CROWD)) if s]
        while not self.stop.wait(1.0):
            for i, s in enumerate(self.socks):
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    s.close()
                    self.socks[i] = self._open() or s

    def __enter__(self) -> Crowd:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


PIPELINERS = 200
PIPELINED = 50
RECONNECT_S = 2.5
PROBE_EVERY_S = 0.2


class PipelineCrowd:
    """PIPELINERS connections that each send PIPELINED GETs in one go and never read; all reopened every
    RECONNECT_S (and any the agent dropped, at once)."""

    def __init__(self, sock_path: Path, request: bytes = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"):
        self.sock_path = str(sock_path)
        self.request = request
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.opened = 0

    def _open(self) -> socket.socket | None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        try:
            s.connect(self.sock_path)
            s.sendall(self.request * PIPELINED)
            self.opened += 1
            return s
        except OSError:
            s.close()
            return None

    def _run(self) -> None:
        socks: list[socket.socket | None] = []
        while not self.stop.is_set():
            for s in socks:
                if s is not None:
                    s.close()
            socks = [self._open() for _ in range(PIPELINERS)]
            self.stop.wait(RECONNECT_S)
        for s in socks:
            if s is not None:
                s.close()

    def __enter__(self) -> PipelineCrowd:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def probe_outcome(sock_path: Path, target: str = "/healthz") -> str:
    """What one probe met: "200", "503" (any other status as its number), "reset", "broken pipe", "EAGAIN"
    (a full listen queue), "timeout", or another error's name."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(PROBE_TIMEOUT_S)
    try:
        s.connect(str(sock_path))
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        first = s.recv(64)
        parts = first.split(b" ", 2)
        return parts[1].decode() if first.startswith(b"HTTP/1.") and len(parts) > 1 else "no status line"
    except ConnectionResetError:
        return "reset"
    except BrokenPipeError:
        return "broken pipe"
    except BlockingIOError:
        return "EAGAIN"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()


def pipeline_round(env: dict[str, str], state: Path, seconds: float, nice: int) -> dict[str, int]:
    proc = start_agent(env, state, nice)
    try:
        with PipelineCrowd(state / "agent.sock") as crowd:
            deadline = time.monotonic() + 30
            while crowd.opened < PIPELINERS and time.monotonic() < deadline:
                time.sleep(0.05)
            tally: dict[str, int] = {}
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t = time.monotonic()
                got = probe_outcome(state / "agent.sock")
                tally[got] = tally.get(got, 0) + 1
                time.sleep(max(0.0, PROBE_EVERY_S - (time.monotonic() - t)))
        return tally
    finally:
        proc.terminate()
        proc.wait(30)


def probe_s(sock_path: Path) -> tuple[float, bool]:
    """Seconds until /healthz answered 200 (or the timeout), and whether it did."""
    t = time.perf_counter()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(PROBE_TIMEOUT_S)
    try:
        s.connect(str(sock_path))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        first = s.recv(64)
        ok = first.startswith(b"HTTP/1.1 200")
    except OSError:
        ok = False
    finally:
        s.close()
    return (time.perf_counter() - t if ok else PROBE_TIMEOUT_S), ok


def start_agent(env: dict[str, str], state: Path, nice: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "gpuwarden", "--state-dir", str(state), "--backend", "sim", "agent",
            "--foreground", "--interval", "1"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (state / "agent.sock").exists() and probe_s(state / "agent.sock")[1]:
            return proc
        if proc.poll() is not None:
            raise SystemExit(f"the agent in {state} exited with {proc.returncode} before it answered")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the agent in {state} did not answer /healthz within 60 s")


def one_round(env: dict[str, str], state: Path, seconds: float, nice: int) -> list[float]:
    proc = start_agent(env, state, nice)
    try:
        with Crowd(state / "agent.sock") as crowd:
            deadline = time.monotonic() + 30
            while len(crowd.socks) < CROWD // 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            latencies = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                latencies.append(probe_s(state / "agent.sock")[0])
        return latencies
    finally:
        proc.terminate()
        proc.wait(30)


def summary(xs: list[float]) -> str:
    xs = sorted(xs)
    n = len(xs)
    late = sum(x > 0.1 for x in xs)
    missed = sum(x >= PROBE_TIMEOUT_S for x in xs)
    return (f"{n:5d} probes  p50 {xs[n // 2] * 1e3:6.1f} ms  p99 {xs[int(n * 0.99)] * 1e3:6.1f} ms  "
            f"max {xs[-1] * 1e3:6.1f} ms  >100 ms {late:3d}  unanswered {missed}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="HEAD~1", help="git ref of the code to compare with (default HEAD~1)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=7.0, help="probing time a round")
    ap.add_argument("--hog", action="store_true", help="spin every core at nice 0, the agents at nice 10")
    ap.add_argument("--mode", choices=("slowloris", "pipeline"), default="slowloris",
                    help="the crowd: slow senders (default) or pipelining clients that never read")
    opts = ap.parse_args()
    print(benchlib.machine_line())
    hogs: list[subprocess.Popen[bytes]] = []
    if opts.hog:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-slowloris-") as tmp:
            tmp_path = Path(tmp)
            trees = benchlib.compared_trees(REPO, opts.peer, tmp_path)
            envs = {name: benchlib.linked_env(tree, tmp_path / f"pkgs-{i}")
                    for i, (name, tree) in enumerate(trees.items())}
            results: dict[str, list[float]] = {name: [] for name in trees}
            tallies: dict[str, dict[str, int]] = {name: {} for name in trees}
            for r in range(opts.rounds):
                for name, env in envs.items():
                    state = tmp_path / f"state-{r}-{name.split()[0]}"
                    subprocess.run([sys.executable, "-m", "gpuwarden", "--state-dir", str(state), "sim", "init",
                                    "--gpus", "2"], env=env, check=True, capture_output=True)
                    if opts.mode == "pipeline":
                        for k, v in pipeline_round(env, state, opts.seconds, 10 if opts.hog else 0).items():
                            tallies[name][k] = tallies[name].get(k, 0) + v
                    else:
                        results[name].extend(one_round(env, state, opts.seconds, 10 if opts.hog else 0))
                print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)
    finally:
        for h in hogs:
            h.kill()
    if opts.mode == "pipeline":
        print(f"/healthz every {PROBE_EVERY_S:g} s under {PIPELINERS} clients x {PIPELINED} pipelined GETs, never "
              f"read, reconnecting every {RECONNECT_S:g} s; {opts.rounds} rounds of {opts.seconds:g} s"
              f"{', CPU hog on every core, agents at nice 10' if opts.hog else ''}:")
        for name, tally in tallies.items():
            n = sum(tally.values())
            shown = ", ".join(f"{k}: {v}" for k, v in sorted(tally.items(), key=lambda kv: -kv[1]))
            print(f"  {name:>18}: {tally.get('200', 0)}/{n} answered 200  ({shown})")
        return 0
    print(f"/healthz under a reconnecting crowd of {CROWD}, {opts.rounds} rounds of {opts.seconds:g} s"
          f"{', CPU hog on every core, agents at nice 10' if opts.hog else ''}:")
    for name, xs in results.items():
        print(f"  {name:>18}: {summary(xs)}")
    this, peer = (sorted(xs) for xs in results.values())
    p99 = [xs[int(len(xs) * 0.99)] for xs in (this, peer)]
    print(f"  p99 ratio this/peer: {p99[0] / p99[1]:.2f}x   max ratio: {this[-1] / peer[-1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
