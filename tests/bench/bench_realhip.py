"""Benchmark: ROCm 5.4's real hipHostRegister failing on a machine without a GPU, and how soon launch says so.

Per run: a program times the real call itself (clock_gettime around it), N times in one process, without the
interposer (the peer) and under it (gated, 1 slot); the interposer's own `seconds` for the call; and the wall time
of `gpuwarden launch` of 1 and 4 such engines until it exits 1 (before the fix it waited out its timeout,
registration_timeout x engines + 60 s: 660 s and 2,460 s at the defaults).
Run: python tests/bench/bench_realhip.py [--calls 200]
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from benchlib import machine, machine_line  # noqa: E402

from helpers import realhip  # noqa: E402
from gpuwarden.ops.engines import preload  # noqa: E402
from gpuwarden.ops.foundation.status_protocol import read_events  # noqa: E402

TIMER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int hipHostRegister(void *p, size_t n, unsigned flags);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    static char buf[4096];
    size_t size = strtoull(argv[1], NULL, 10);
    int calls = atoi(argv[2]);
    for (int i = 0; i < calls; i++) {
        double t0 = now();
        int r = hipHostRegister(buf, size, 0);
        printf("%d %.9f\n", r, now() - t0);
    }
    return 0;
}
"""
SIZE = 300 << 20


def run_timer(exe: Path, calls: int, env: dict[str, str]) -> tuple[set[int], list[float]]:
    out = subprocess.run([str(exe), str(SIZE), str(calls)], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True).stdout.split()
    return {int(r) for r in out[0::2]}, [float(s) for s in out[1::2]]


def launch_wall(work: Path, exe: Path, engines: int) -> float:
    state = work / f"state{engines}"
    cfg = work / f"node{engines}.toml"
    lines = ["[stagger]", "slots = 1", "[defaults]", 'progress = "preload"', "stop_grace = 2", ""]
    for i in range(engines):
        lines += ["[[engines]]", f'name = "e{i}"', f"gpu = {i}", f'argv = ["{exe}", "{SIZE}", "linked"]', ""]
    cfg.write_text("\n".join(lines))
    cli = [sys.executable, "-m", "gpuwarden", "--state-dir", str(state)]
    subprocess.run([*cli, "sim", "init", "--gpus", str(engines)], capture_output=True, check=True)
    t0 = time.monotonic()
    done = subprocess.run([*cli, "--config", str(cfg), "launch", "--stagger", "1"], capture_output=True, text=True)
    took = time.monotonic() - t0
    subprocess.run([*cli, "engines", "stop", "--all"], capture_output=True)
    if done.returncode != 1 or "hipErrorInvalidDevice" not in done.stderr + done.stdout:
        raise SystemExit(f"launch did not fail on the registration: {done.stdout}{done.stderr}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    why = realhip.unsupported()
    if why:
        raise SystemExit(why)
    lib = realhip.ensure()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "timer.c").write_text(TIMER)
        exe = work / "timer"
        subprocess.run(["cc", "-O1", "-o", str(exe), str(work / "timer.c"), f"-L{lib}", "-l:libamdhip64.so",
                        f"-Wl,-rpath,{lib}"], check=True)
        engine = work / "engine_linked"
        subprocess.run(["cc", "-O1", "-o", str(engine), str(REPO / "tests/standins/preload/engine.c"), "-DLINKED",
                        f"-L{lib}", "-l:libamdhip64.so", f"-Wl,-rpath,{lib}", "-ldl"], check=True)
        bare_codes, bare = run_timer(exe, args.calls, {})
        status = work / "status.jsonl"
        env = {"LD_PRELOAD": str(preload.LIBRARY), "GPUWARDEN_STATUS_FILE": str(status),
               "GPUWARDEN_GATE_DIR": str(work / "gate"), "GPUWARDEN_GATE_SLOTS": "1"}
        gated_codes, gated = run_timer(exe, args.calls, env)
        recorded = [e.data["seconds"] for e in read_events(status) if e.phase == "register-failed"]
        launch_1 = launch_wall(work, engine, 1)
        launch_4 = launch_wall(work, engine, 4)
    med = statistics.median
    result = {
        "machine": machine(), "calls": args.calls, "codes_bare": sorted(bare_codes), "codes_gated": sorted(gated_codes),
        "first_call_bare_ms": round(bare[0] * 1e3, 3), "median_call_bare_us": round(med(bare[1:]) * 1e6, 1),
        "first_call_gated_ms": round(gated[0] * 1e3, 3), "median_call_gated_us": round(med(gated[1:]) * 1e6, 1),
        "gated_over_bare": round(med(gated[1:]) / med(bare[1:]), 2),
        "interposer_seconds_median_us": round(med(recorded) * 1e6, 1) if recorded else None,
        "launch_fail_s_1_engine": round(launch_1, 2), "launch_fail_s_4_engines": round(launch_4, 2),
    }
    print(machine_line())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
