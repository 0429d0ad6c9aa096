"""Cost of one full gpuwarden snapshot on a simulated node of 8 GPUs with 2,000 processes.

Peer in the same run: psutil.process_iter over the host (what a typical Python monitor does per refresh).
Cases: 32 of 2,000 processes use GPUs; all 2,000 do (with pidfds, and with the stat-reading fallback); the
per-process load (CPU%/RSS from stat, GPU% from each process's DRM client's fdinfo) on and off, in turns.
--repeat N measures the 2,000 case N times with a fresh sampler each and reports the median of the medians:
one 30-refresh median moves by 2x with what else runs on the machine.
It also prints what decides which path runs (fd limit, pidfds, the state dir's file system, Python build).
--peer REF runs the same per-process-load refresh of a git ref's tree (git archive, its own process on the same sim
node and processes) in turns with this tree's: the change against the code before it, under the same load.
Run: python tests/bench/bench_snapshot_sim.py [--runs 30] [--repeat 5] [--peer main] [--json-out FILE]
(psutil: pip install -e ".[bench]")
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil  # noqa: E402
from benchlib import machine, machine_line, median_ms, times_ms  # noqa: E402

from gpuwarden.ops.node.backends.sysfs import SysfsBackend  # noqa: E402
from gpuwarden.ops.foundation.pidwatch import usable as pidfds_usable  # noqa: E402
from gpuwarden.ops.foundation.settings import Settings  # noqa: E402
from gpuwarden.ops.node.sim.node import SimNode  # noqa: E402
from gpuwarden.ops.sampling.sampler import Sampler  # noqa: E402

N_PROCS = 2000
N_GPUS = 8
TARGET_MS = 10.0


def measure(settings: Settings, node: SimNode, runs: int, use_pidfds: bool, expect: int) -> dict[str, float]:
    """One sampler as the TUI keeps it: first refresh, warm refreshes (wall and CPU), deep scan."""
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    sampler = Sampler(settings, backend, deep_every_s=1e9, use_pidfds=use_pidfds)
    try:
        t = time.perf_counter()
        snap = sampler.snapshot(deep=False)
        first = (time.perf_counter() - t) * 1e3
        assert len(snap.gpus) == N_GPUS and len(snap.processes) >= expect, len(snap.processes)
        assert all(p.state != "gone" for p in snap.processes)
        warm = sorted(times_ms(lambda: sampler.snapshot(deep=False), runs))
        cpu = statistics.median(times_ms(lambda: sampler.snapshot(deep=False), runs, clock=time.process_time))
        deep = median_ms(lambda: sampler.snapshot(deep=True), 3, warmup=0)
        # Every RELIST_EVERY-th refresh lists each KFD PID directory again: the slow tail.
        return {"first": first, "warm": statistics.median(warm), "cpu": cpu,
                "p95": warm[int(0.95 * (len(warm) - 1))], "max": warm[-1], "deep": deep}
    finally:
        sampler.close()


class _NoSensors:
    def read(self):
        return None


class SensorsOff(dict):
    """In place of SysfsBackend._sensors (index -> reader, made at first use): every GPU's reader reads nothing."""

    def get(self, key, default=None):
        return _NoSensors()


def sensors_ab(settings: Settings, node: SimNode, runs: int) -> tuple[float, float]:
    """CPU-time medians of a full refresh (2,000 processes) with and without the sensor readers, taken in turns
    so both see the same machine load: the refresh before and after the sensors, in one run."""
    samplers = []
    for keep in (True, False):
        backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
        backend.gpus()
        if not keep:
            backend._sensors = SensorsOff()
        sampler = Sampler(settings, backend, deep_every_s=1e9)
        sampler.snapshot(deep=False)
        samplers.append(sampler)
    on, off = [], []
    try:
        for _ in range(runs):
            for sampler, out in zip(samplers, (on, off)):
                t = time.process_time()
                sampler.snapshot(deep=False)
                out.append((time.process_time() - t) * 1e3)
        return statistics.median(on), statistics.median(off)
    finally:
        for sampler in samplers:
            sampler.close()


# The peer tree's refresh with the per-process load, in a process of its own: one refresh per line read, its CPU ms
# (all its threads) written back. Only what both trees have is used (SysfsBackend, Sampler, fdinfo_root).
PEER_WORKER = r"""
import sys, time
from pathlib import Path
from gpuwarden.ops.node.backends.sysfs import SysfsBackend
from gpuwarden.ops.sampling.sampler import Sampler
from gpuwarden.ops.foundation.settings import Settings
state, sysfs, dev, fdinfo = map(Path, sys.argv[1:5])
backend = SysfsBackend(sysfs_root=sysfs, dev_root=dev)
backend.fdinfo_root = fdinfo
sampler = Sampler(Settings(state_dir=state), backend, deep_every_s=1e9, process_load=True)
sampler.snapshot(deep=True)
print("ready", flush=True)
for _ in sys.stdin:
    t = time.process_time()
    snap = sampler.snapshot(deep=False)
    print(f"{(time.process_time() - t) * 1e3:.4f} {len(snap.processes)}", flush=True)
"""


def start_peer(ref: str, node: SimNode, state: Path, tmp: Path) -> subprocess.Popen:
    """The peer tree's worker on this node (PYTHONPATH's gpuwarden is the peer's: benchlib.tree_env)."""
    import benchlib
    repo = Path(__file__).resolve().parents[2]
    env = benchlib.linked_env(benchlib.export_tree(repo, ref, tmp), tmp / "pkgs")
    worker = subprocess.Popen([sys.executable, "-c", PEER_WORKER, str(state), str(node.sysfs_root),
                               str(node.dev_root), str(node.root / "proc")], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None and worker.stdout.readline().strip() == "ready", "the peer worker did not start"
    return worker


def peer_refresh(worker: subprocess.Popen) -> tuple[float, int]:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write("\n")
    worker.stdin.flush()
    ms, n = worker.stdout.readline().split()
    return float(ms), int(n)


def load_ab(settings: Settings, node: SimNode, runs: int, peer: subprocess.Popen | None = None
            ) -> tuple[float, float, float, float | None]:
    """CPU-time medians of a full refresh (2,000 processes, each a DRM client whose engine time grows) with the
    per-process load (host CPU/RSS from /proc stat, GPU% from fdinfo) and without it, in turns; and the fdinfo
    reads per refresh. The simulated driver's tick (rewriting the fdinfo files) runs between, untimed. With `peer`,
    the peer tree's refresh with the load takes its turn too (its CPU median is the fourth value)."""
    drm = node.drm
    bus_of = node.bus_ids()
    samplers = []
    drm.tick(bus_of)  # the clients' fdinfo files are there before the first deep scan finds their fds
    for with_load in (True, False):
        backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
        backend.fdinfo_root = node.root / "proc"  # type: ignore[attr-defined]  (what SimBackend sets)
        sampler = Sampler(settings, backend, deep_every_s=1e9, process_load=with_load)
        sampler.snapshot(deep=True)
        samplers.append(sampler)
    on, off, reads, theirs = [], [], [], []
    if peer is not None:
        for _ in range(3):  # as warm as this tree's samplers (their first deep scan and refresh are behind them)
            drm.tick(bus_of)
            peer_refresh(peer)
    try:
        for _ in range(runs):
            for sampler, out in zip(samplers, (on, off)):
                drm.tick(bus_of)
                t = time.process_time()
                snap = sampler.snapshot(deep=False)
                out.append((time.process_time() - t) * 1e3)
                if sampler.load is not None:
                    reads.append(sampler.load.reads)
                    assert sampler.load.reads <= sampler.load.per_refresh and len(snap.process_load) == N_PROCS
            if peer is not None:
                drm.tick(bus_of)
                ms, n = peer_refresh(peer)
                assert n >= N_PROCS, n
                theirs.append(ms)
        return (statistics.median(on), statistics.median(off), statistics.median(reads),
                statistics.median(theirs) if theirs else None)
    finally:
        for sampler in samplers:
            sampler.close()


def breakdown(settings: Settings, node: SimNode, runs: int) -> list[tuple[str, float]]:
    """Where a refresh with the per-process load goes: CPU medians of its parts called one by one as snapshot()
    calls them (on their lanes), the system-call floors of the KFD pass beside them, the rest of snapshot() last."""
    drm = node.drm
    bus_of = node.bus_ids()
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    backend.fdinfo_root = node.root / "proc"  # type: ignore[attr-defined]
    sampler = Sampler(settings, backend, deep_every_s=1e9, process_load=True)
    try:
        sampler.snapshot(deep=True)
        for _ in range(3):
            drm.tick(bus_of)
            sampler.snapshot(deep=False)
        attribution, load = sampler.attribution, sampler.load
        assert load is not None
        gpus, processes = attribution.sample()
        base = str(node.sysfs_root / "class/kfd/kfd/proc")
        fds = backend._repeat[1] if backend._repeat is not None else []

        def listing() -> None:
            [n for n in os.listdir(base) if n.isdigit()]
        parts: list[tuple[str, Any]] = [
            ("whole refresh (snapshot)", lambda: sampler.snapshot(deep=False)),
            ("GPU read, 8 GPUs with sensors (Backend.gpus)", backend.gpus),
            ("KFD per-process VRAM, 2,000 PIDs (Backend.process_usage)", backend.process_usage),
            ("  of it: listing the KFD proc directory (listdir, the floor)", listing),
            (f"  of it: {len(fds)} preads of the held vram files (the floor)", lambda: [os.pread(fd, 64, 0) for fd in fds]),
            ("attribution of the processes (Attribution.sample less the two above)", attribution.sample),
            ("per-process load, 32 stat + 32 fdinfo a refresh (ProcLoadReader.sample)",
             lambda: load.sample(processes, gpus, attribution.drm_fds, None)),
            ("driver's books, debugfs (9 files, one lane job)", lambda: sampler._driver_books(gpus)),
            ("state files, engines, arenas (NodeExtras.sample)", sampler.extras.sample),
            ("residual and holders (Attribution.residual)", lambda: attribution.residual(gpus, processes, {})),
        ]
        times: dict[str, list[float]] = {label: [] for label, _ in parts}
        for _ in range(runs):
            for label, fn in parts:
                drm.tick(bus_of)
                t = time.process_time()
                fn()
                times[label].append((time.process_time() - t) * 1e3)
        med = {label: statistics.median(v) for label, v in times.items()}
        sample_key = "attribution of the processes (Attribution.sample less the two above)"
        med[sample_key] -= med["GPU read, 8 GPUs with sensors (Backend.gpus)"] + \
            med["KFD per-process VRAM, 2,000 PIDs (Backend.process_usage)"]
        counted = sum(v for k, v in med.items() if k != "whole refresh (snapshot)" and not k.startswith("  "))
        out = [(label, med[label]) for label, _ in parts]
        out.append(("the rest of snapshot(): warnings, the record (whole less the parts)",
                    med["whole refresh (snapshot)"] - counted))
        return out
    finally:
        sampler.close()


def sensor_cost(node: SimNode, runs: int) -> tuple[float, float]:
    """Median ms of one Backend.gpus() on the 8 GPUs with the sensor readers, and with them taken out, in turns."""
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    try:
        backend.gpus()
        readers = backend._sensors
        on, off = [], []
        for _ in range(max(runs, 30)):
            backend._sensors = readers
            on.append(median_ms(backend.gpus, 20, warmup=0))
            backend._sensors = SensorsOff()
            off.append(median_ms(backend.gpus, 20, warmup=0))
        return statistics.median(on), statistics.median(off)
    finally:
        backend.close()


def environment(state: Path) -> str:
    """What decides the refresh's path: pidfds, the descriptor limit, the file system under the sim tree."""
    import resource
    import sysconfig
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(state)], capture_output=True, text=True).stdout.strip()
    opt = "yes" if "--enable-optimizations" in (sysconfig.get_config_var("CONFIG_ARGS") or "") else "no"
    return (f"pidfds usable: {pidfds_usable(Path('/proc'))}; RLIMIT_NOFILE {soft}/{hard}; state dir on {fs}; "
            f"uid {os.geteuid()}; Python configured --enable-optimizations: {opt}; PYTHONDONTWRITEBYTECODE="
            f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")


def load_report(args: argparse.Namespace, settings: Settings, node: SimNode, state: Path) -> float:
    """load_ab (with the peer tree when --peer asks) and its lines; the CPU median with the load."""
    peer = start_peer(args.peer, node, state, Path(tempfile.mkdtemp(prefix="gw-bench-peer-"))) if args.peer \
        else None
    try:
        load_on, load_off, reads, load_peer = load_ab(settings, node, args.runs, peer)
    finally:
        if peer is not None:
            peer.kill()
            peer.wait()
    print(f"2,000 GPU processes, each a busy DRM client, full refresh in turns: {load_on:.2f} ms with the "
          f"per-process load (CPU%/RSS/GPU%), {load_off:.2f} ms without (CPU medians; its share "
          f"{load_on - load_off:+.2f} ms); fdinfo reads a refresh: {reads:.0f} for {N_PROCS} clients")
    if load_peer is not None:
        print(f"  peer ({args.peer}), the same refresh with the load, in the same turns: {load_peer:.2f} ms CPU "
              f"median; this tree / peer: {load_on / load_peer:.2f}x")
    return load_on


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="warm refreshes per case (median reported)")
    ap.add_argument("--repeat", type=int, default=1, help="measure the 2,000-process case this many times")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--load-only", action="store_true", help="only the per-process-load A/B (about a minute)")
    ap.add_argument("--peer", metavar="REF", help="also measure this git ref's tree (e.g. main) in turns")
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    settings = Settings(state_dir=state)
    node = SimNode(state)
    node.init(gpus=N_GPUS, vram=192 << 30)
    # Each process holds its GPU's render node (as stdin, fd 0): a DRM client of the simulated driver.
    renders = [open(node.render_node(i % N_GPUS), "rb") for i in range(N_GPUS)]
    procs = [subprocess.Popen(["sleep", "600"], stdin=renders[i % N_GPUS]) for i in range(N_PROCS)]
    for f in renders:
        f.close()
    try:
        pids = [p.pid for p in procs]
        node.drm.open_many([(pid, 0, i % N_GPUS, 0.3) for i, pid in enumerate(pids)])
        print(machine_line())
        print(environment(state))
        print(f"{len(psutil.pids())} processes on the host; median of {args.runs} warm refreshes per case")
        if args.load_only:
            node.allocate_many([(pids[i], i % N_GPUS, 64 << 20) for i in range(N_PROCS)])
            load_on = load_report(args, settings, node, state)
            print(f"where a refresh with the per-process load goes (CPU medians of {args.runs}, parts called one by one):")
            for label, ms in breakdown(settings, node, args.runs):
                print(f"  {ms:6.2f} ms  {label}")
            print(f"target: with the per-process load < {TARGET_MS:.0f} ms: {load_on:.2f} ms CPU, "
                  f"{'met' if load_on < TARGET_MS else 'MISSED'}")
            return 0 if load_on < TARGET_MS else 1
        peer = median_ms(lambda: [p.info for p in psutil.process_iter(["pid", "status", "memory_info"])], 10)
        rows = []
        allocated = 0
        for label, n, pidfds in (("32 GPU processes", 32, True), ("2,000 GPU processes", N_PROCS, True),
                                 ("2,000, no pidfds", N_PROCS, False)):
            t = time.perf_counter()
            node.allocate_many([(pids[i], i % N_GPUS, 64 << 20) for i in range(allocated, n)])
            allocated = max(allocated, n)
            setup = time.perf_counter() - t
            row = measure(settings, node, args.runs, pidfds, n)
            row["sync"] = median_ms(node.sync, 5, warmup=0)
            rows.append((label, row))
            print(f"  ({label}: set up in {setup:.0f} s)", flush=True)
        print(f"peer: psutil.process_iter(pid,status,memory_info) over the host: {peer:.2f} ms")
        print(f"{'case':<22} {'refresh':>9} {'vs peer':>8} {'CPU':>8} {'p95':>8} {'max':>8} {'first':>8} "
              f"{'deep scan':>10} {'sim sync':>9}")
        for label, r in rows:
            print(f"{label:<22} {r['warm']:>7.2f}ms {peer / r['warm']:>7.1f}x {r['cpu']:>6.2f}ms {r['p95']:>6.2f}ms "
                  f"{r['max']:>6.1f}ms {r['first']:>6.1f}ms {r['deep']:>8.1f}ms {r['sync']:>7.1f}ms")
        full = dict(rows)["2,000 GPU processes"]["warm"]
        if args.repeat > 1:
            runs = [measure(settings, node, args.runs, True, N_PROCS) for _ in range(args.repeat)]
            warm = sorted(r["warm"] for r in runs)
            cpu = sorted(r["cpu"] for r in runs)
            p95 = sorted(r["p95"] for r in runs)
            print(f"2,000 GPU processes, {args.repeat} samplers: refresh medians {', '.join(f'{w:.2f}' for w in warm)} ms "
                  f"-> median {statistics.median(warm):.2f} ms; CPU median {statistics.median(cpu):.2f} ms; "
                  f"p95 median {statistics.median(p95):.1f} ms")
            full = statistics.median(warm)
        sampler = Sampler(settings, SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root),
                          deep_every_s=1e9)
        sampler.snapshot(deep=False)
        snap = sampler.snapshot(deep=False)
        to_json = median_ms(lambda: snap.to_json(indent=None), 10)
        sampler.close()
        print(f"snapshot JSON of 2,000 processes (status --json, the agent's /v1/snapshot): {to_json:.1f} ms")
        on_ms, off_ms = sensors_ab(settings, node, args.runs)
        print(f"2,000 GPU processes, full refresh in turns: {on_ms:.2f} ms with the sensors, {off_ms:.2f} ms without "
              f"(CPU medians; the sensors' share {on_ms - off_ms:+.2f} ms)")
        load_on = load_report(args, settings, node, state)
        sensors_on, sensors_off = sensor_cost(node, args.runs)
        print(f"GPU read of 8 GPUs (Backend.gpus): {sensors_on:.3f} ms with the sensors, {sensors_off:.3f} ms without "
              f"(sensors: +{sensors_on - sensors_off:.3f} ms a refresh, {sensors_on / sensors_off:.2f}x)")
        print(f"target: refresh < {TARGET_MS:.0f} ms for 8 GPUs with 2,000 GPU processes: "
              f"{full:.2f} ms, {'met' if full < TARGET_MS else 'MISSED'}; with the per-process load "
              f"{load_on:.2f} ms CPU, {'met' if load_on < TARGET_MS else 'MISSED'}")
        if args.json_out:
            args.json_out.write_text(json.dumps({
                "machine": machine(), "runs": args.runs, "peer_ms": round(peer, 3),
                "cases": {label: {k: round(v, 3) for k, v in r.items()} for label, r in rows}}, indent=2) + "\n")
        return 0 if full < TARGET_MS else 1
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
