"""TUI cost and responsiveness on a simulated node of 8 GPUs, 32 supervised engines and 2,000 processes.

1. CPU: the installed `gpuwarden tui` runs at 1 Hz in tmux (a real terminal); its CPU time over WINDOW_S is
   measured with psutil, next to two peers running at 1 Hz in the same run: `gpuwarden status --watch
   --interval 1` (same data, no TUI) and `top -b -d 1`. Target: TUI under 3% of one core.
2. Key-to-screen latency in tmux while the sim backend's call hangs for 10 s (the bench holds the sim
   driver's lock): time from sending a key until tmux shows its effect, against the same before the hang.
   Target: under 100 ms.
Run: /tmp/venv/bin/python tests/bench/bench_tui.py   (needs tmux and the bench extra: pip install -e ".[bench]"; about 2 minutes)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "bench"))

import psutil  # noqa: E402

from benchlib import cpu_model  # noqa: E402
from gpuwarden.ops.node.sim.node import SimNode  # noqa: E402

GPUWARDEN = Path(sys.executable).parent / "gpuwarden"
FAKE_ENGINE = REPO / "tests" / "engines" / "fake_engine.py"
N_GPUS, N_ENGINES, N_PROCS = 8, 32, 2000
WARMUP_S, WINDOW_S = 8.0, 30.0
HANG_S = 10.0


def write_config(path: Path) -> Path:
    lines = ["[stagger]", "slots = 8", "registration_timeout = 60", "", "[defaults]", "stop_grace = 2", ""]
    argv = json.dumps([sys.executable, str(FAKE_ENGINE), "--register-s", "0.05"])
    for i in range(N_ENGINES):
        lines += ["[[engines]]", f'name = "e{i:02d}"', f"gpu = {i % N_GPUS}", f"argv = {argv}", ""]
    path.write_text("\n".join(lines))
    return path


def cli(state: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPUWARDEN), "--state-dir", str(state), "--backend", "sim", *args],
                          capture_output=True, text=True, **kw)


def tmux(sock: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-S", str(sock), *args], capture_output=True, text=True)


def descendants_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children."""
    try:
        p = psutil.Process(pid)
        total = sum(p.cpu_times()[:2])
        for c in p.children(recursive=True):
            try:
                total += sum(c.cpu_times()[:2])
            except psutil.NoSuchProcess:
                pass
        return total
    except psutil.NoSuchProcess:
        return 0.0


def find_pid(sock: Path, window: str, name: str) -> int:
    """The pid of the process called `name` under tmux window `window`'s shell."""
    out = tmux(sock, "list-panes", "-t", window, "-F", "#{pane_pid}").stdout.split()
    pane = psutil.Process(int(out[0]))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = []
        for p in [pane, *pane.children(recursive=True)]:
            try:
                if name in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.NoSuchProcess:
                continue
        # The shell that started it matches too: take the match none of whose children match.
        for p in found:
            try:
                if not any(c in found for c in p.children(recursive=True)):
                    return p.pid
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    raise RuntimeError(f"{name!r} not found under tmux window {window}")


def cpu_percent_over(pids: dict[str, int], window_s: float) -> dict[str, float]:
    """Each named process's CPU, its children's included, over the next window_s, as % of one core."""
    before = {k: descendants_cpu(p) for k, p in pids.items()}
    t0 = time.monotonic()
    time.sleep(window_s)
    wall = time.monotonic() - t0
    after = {k: descendants_cpu(p) for k, p in pids.items()}
    return {k: 100.0 * (after[k] - before[k]) / wall for k in pids}


def end_sessions(sock: Path, pids: dict[str, int]) -> None:
    """End each measured process by its pid, then the tmux server (top -b writing to /dev/null outlives its
    terminal's hangup)."""
    for pid in pids.values():
        try:
            psutil.Process(pid).terminate()
        except psutil.NoSuchProcess:
            pass
    tmux(sock, "kill-server")


def measure_cpu(state: Path, config: Path) -> dict[str, float]:
    sock = state / "tmux.sock"
    base = f"{GPUWARDEN} --state-dir {state} --config {config} --backend sim"
    tmux(sock, "new-session", "-d", "-x", "160", "-y", "48", "-s", "tui", f"{base} tui --refresh 1")
    tmux(sock, "new-session", "-d", "-x", "160", "-y", "48", "-s", "watch", f"{base} status --watch --interval 1")
    tmux(sock, "new-session", "-d", "-x", "160", "-y", "48", "-s", "top", "top -b -d 1 > /dev/null")
    pids: dict[str, int] = {}
    try:
        pids = {"tui": find_pid(sock, "tui", " tui"), "status --watch": find_pid(sock, "watch", "status --watch"),
                "top -b -d 1": find_pid(sock, "top", "top -b")}
        time.sleep(WARMUP_S)
        screen = tmux(sock, "capture-pane", "-p", "-t", "tui").stdout
        return {"screen": screen, **cpu_percent_over(pids, WINDOW_S)}
    finally:
        end_sessions(sock, pids)


class SimLockHang:
    """Holds the sim driver's lock: the sim backend's next call blocks on it, like a wedged GPU driver."""

    def __init__(self, state: Path):
        self.path = state / "sim" / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> "SimLockHang":
        import fcntl
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def wait_screen(sock: Path, target: str, needle: str, present: bool = True, timeout: float = 10.0) -> float:
    """Poll the pane until `needle` is (or is no longer) on it; returns when that happened (perf_counter)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = tmux(sock, "capture-pane", "-p", "-t", target).stdout
        if (needle in text) == present:
            return time.perf_counter()
        time.sleep(0.004)  # a busy poll would take a core from the TUI on a small machine
    raise RuntimeError(f"{needle!r} {'never appeared' if present else 'never went away'}")


def cursor_line(sock: Path, target: str) -> int | None:
    """The screen line that carries the focused table's cursor (drawn in reverse video)."""
    text = tmux(sock, "capture-pane", "-p", "-e", "-t", target).stdout
    for i, line in enumerate(text.splitlines()[1:-1], 1):
        if "\x1b[7m" in line or ";7m" in line or "[7;" in line:
            return i
    return None


def cursor_moves(sock: Path, target: str, key: str, timeout: float = 10.0) -> float:
    """ms from sending an arrow key until the cursor line has moved on the screen."""
    before = cursor_line(sock, target)
    t0 = time.perf_counter()
    tmux(sock, "send-keys", "-t", target, key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = cursor_line(sock, target)
        if now is not None and now != before:
            return (time.perf_counter() - t0) * 1e3
        time.sleep(0.004)
    raise RuntimeError("the cursor never moved")


def capture_floor(sock: Path, target: str, n: int = 20) -> float:
    """Median ms of one capture-pane: the resolution of every figure here."""
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        tmux(sock, "capture-pane", "-p", "-t", target)
        xs.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(xs)


def key_latencies(sock: Path, target: str, rounds: int, deadline: float | None = None) -> dict[str, list[float]]:
    """ms from sending a key until tmux shows its effect: ↓/↑ move the cursor, `?` opens the key list,
    Enter a GPU's detail, Esc goes back to the panels."""
    out: dict[str, list[float]] = {"Down/Up (cursor)": [], "? (key list)": [], "Enter (GPU detail)": [],
                                   "q (back to panels)": [], "Esc (back, +ESCDELAY)": []}
    for _ in range(rounds):
        if deadline is not None and time.monotonic() > deadline:
            break
        for key in ("Down", "Up"):
            out["Down/Up (cursor)"].append(cursor_moves(sock, target, key))
        for key, label, needle, back in (("?", "? (key list)", "WHAT IT DOES", "q"),
                                         ("Enter", "Enter (GPU detail)", "Processes on this GPU", "Escape")):
            t0 = time.perf_counter()
            tmux(sock, "send-keys", "-t", target, key)
            out[label].append((wait_screen(sock, target, needle) - t0) * 1e3)
            t0 = time.perf_counter()
            tmux(sock, "send-keys", "-t", target, back)
            done = (wait_screen(sock, target, "Engines") - t0) * 1e3
            out["q (back to panels)" if back == "q" else "Esc (back, +ESCDELAY)"].append(done)
    return out


def measure_latency(state: Path, config: Path) -> tuple[dict, dict, str, float]:
    sock = state / "tmux-lat.sock"
    tmux(sock, "new-session", "-d", "-x", "120", "-y", "40", "-s", "tui",
         f"{GPUWARDEN} --state-dir {state} --config {config} --backend sim tui --refresh 1")
    try:
        wait_screen(sock, "tui", "SIMULATED", timeout=30)
        wait_screen(sock, "tui", "engine(s)", timeout=30)
        time.sleep(2)
        floor = capture_floor(sock, "tui")
        prompt = key_latencies(sock, "tui", 5)
        with SimLockHang(state):
            hang_end = time.monotonic() + HANG_S
            wait_screen(sock, "tui", "STALE", timeout=HANG_S)  # the panels say their data is old
            stale_screen = tmux(sock, "capture-pane", "-p", "-t", "tui").stdout.splitlines()[0]
            hung = key_latencies(sock, "tui", 50, deadline=hang_end - 1.0)
            time.sleep(max(0.0, hang_end - time.monotonic()))
        return prompt, hung, stale_screen, floor
    finally:
        tmux(sock, "kill-server")


def main() -> int:
    if shutil.which("tmux") is None:
        print("tmux is not installed: cannot run the TUI in a terminal")
        return 2
    state = Path(tempfile.mkdtemp(prefix="gw-bench-tui-"))
    SimNode(state).init(gpus=N_GPUS, vram=192 << 30)
    config = write_config(state / "node.toml")
    sleepers = [subprocess.Popen(["sleep", "900"]) for _ in range(N_PROCS)]
    node = SimNode(state)
    for i, p in enumerate(sleepers[:32]):  # 32 of them hold simulated VRAM, like tenants
        node.allocate(p.pid, i % N_GPUS, (2 + i % 5) << 30)
    try:
        launch = cli(state, "--config", str(config), "launch", "--json", timeout=300)
        if launch.returncode != 0:
            print("launch failed:", launch.stdout[-2000:], launch.stderr[-2000:])
            return 1
        print(f"machine: {os.cpu_count()} cores, {cpu_model()}; {len(psutil.pids())} processes on the host")
        print(f"node: {N_GPUS} simulated GPUs, {N_ENGINES} supervised engines, {N_PROCS} sleeping processes")
        cpu = measure_cpu(state, config)
        print(f"\nCPU over {WINDOW_S:.0f} s at 1 Hz (% of one core):")
        for k in ("tui", "status --watch", "top -b -d 1"):
            print(f"  {k:<16} {cpu[k]:6.2f}%")
        print(f"  ratio tui / status --watch = {cpu['tui'] / max(cpu['status --watch'], 1e-6):.2f}; "
              f"tui / top = {cpu['tui'] / max(cpu['top -b -d 1'], 1e-6):.2f}  (target: tui < 3%)")
        shown = "32 engine(s)" in cpu["screen"] and "SIMULATED" in cpu["screen"]
        print(f"  the TUI's screen {'showed' if shown else 'did NOT show'} the 8 GPUs and 32 engines")

        print(f"\nkey-to-screen latency in tmux (ms), the sim backend's call hanging for {HANG_S:.0f} s:")
        prompt, hung, stale_line, floor = measure_latency(state, config)
        print(f"  header while hung: {stale_line.strip()[:100]}")
        print(f"  one tmux capture-pane takes {floor:.1f} ms (the resolution of these figures)")
        for label in hung:
            h, p = sorted(hung[label]), sorted(prompt[label])
            print(f"  {label:<22} hung: median {statistics.median(h):6.1f} max {h[-1]:6.1f} (n={len(h)})   "
                  f"not hung: median {statistics.median(p):6.1f}   ratio {statistics.median(h) / statistics.median(p):.2f}")
        print("  (target: under 100 ms while hung; a lone Esc waits Textual's ESCDELAY, 100 ms by default, "
              "to tell it from an escape sequence)")
        return 0
    finally:
        cli(state, "--config", str(config), "engines", "stop", "--all", timeout=120)
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
