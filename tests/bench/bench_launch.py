"""Benchmark: launch-to-all-serving with --stagger 1 against a burst (--stagger N) and a strictly sequential launch.

Target: gated <= (burst + (N-1) x one registration alone) + 10%. Also the shim's start-up cost against Popen.
Fake engines by default; `--runtime cuda --arena PATH` runs canaries (tests/device/launch.sh does that);
`--torch --arena PATH` runs unmodified PyTorch engines under progress = "preload" (tests/device/preload_torch.sh).
"""

from __future__ import annotations

import argparse
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

from benchlib import machine  # noqa: E402

from gpuwarden.ops.engines import state as st  # noqa: E402
from gpuwarden.ops.foundation.status_protocol import read_events  # noqa: E402


TORCH_ENGINE = REPO / "tests" / "device" / "torch_engine.py"


def engine_argv(args: argparse.Namespace) -> list[str]:
    if args.torch:
        return [sys.executable, str(TORCH_ENGINE), args.arena]
    if args.runtime:
        return [sys.executable, "-m", "gpuwarden.ops.canary", "--arena", args.arena, "--gpu", "0", "--runtime", args.runtime,
                "--verify", "header"]
    return [sys.executable, str(REPO / "tests" / "engines" / "fake_engine.py"), "--register-s", str(args.register_s),
            "--startup-s", str(args.startup_s)]


def write_config(path: Path, args: argparse.Namespace) -> None:
    lines = ["[stagger]", f"slots = {args.engines}", "registration_timeout = 300", "",
             "[defaults]", "stop_grace = 20", ""]
    if args.torch:
        # The interposer gates and reports the engines' cudaHostRegister; "serving" says they are ready.
        lines[-1:-1] = ['progress = "preload"', 'ready_pattern = "^serving"', 'register_threshold = "1GiB"']
    for i in range(args.engines):
        gpu = 0 if args.same_gpu else i
        lines += ["[[engines]]", f'name = "b{i}"', f"gpu = {gpu}", f"argv = {json.dumps(engine_argv(args))}", ""]
    path.write_text("\n".join(lines))


def gw(state: Path, config: Path, *rest: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state), "--config", str(config),
                           *rest], cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def windows(state: Path) -> dict[str, float]:
    """Seconds each engine spent registering (registering -> registered), from its status lines."""
    out = {}
    for name in st.names(state):
        events = read_events(st.engine_dir(state, name) / st.STATUS)
        start = next((e.ts for e in events if e.phase == "registering"), None)
        end = next((e.ts for e in events if e.phase == "registered"), None)
        if start is not None and end is not None:
            out[name] = end - start
    return out


def timeline(state: Path, t0: float) -> list[str]:
    """Each engine's gate wait and registration from its status events, seconds after the launch began."""
    rows = []
    for name in st.names(state):
        events = read_events(st.engine_dir(state, name) / st.STATUS)
        at = {e.phase: e.ts - t0 for e in reversed(events)}
        reg = next((e for e in events if e.phase == "registered"), None)
        if "registering" not in at:
            continue
        how = f"{reg.data.get('call', '')} via {reg.data.get('via')}" if reg is not None and reg.data.get("via") else ""
        rows.append((at["registering"], f"  {name}: waiting {at.get('waiting', at['registering']):7.2f}  registering "
                     f"{at['registering']:7.2f}  registered {at.get('registered', float('nan')):7.2f}  {how}"))
    return [line for _, line in sorted(rows)]


def run_mode(label: str, flags: list[str], args: argparse.Namespace, work: Path) -> dict:
    state = work / f"state-{label}"
    config = work / "node.toml"
    t0 = time.monotonic()
    wall0 = time.time()
    proc = gw(state, config, "launch", "--skip-verify", *flags)
    took = time.monotonic() - t0
    regs = windows(state)
    lines = timeline(state, wall0)
    gw(state, config, "engines", "stop", "--all", timeout=120)
    if proc.returncode != 0:
        print(f"{label}: launch failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {"mode": label, "ok": proc.returncode == 0, "seconds": round(took, 3),
            "register_s": {k: round(v, 3) for k, v in sorted(regs.items())}, "timeline": lines}


def shim_overhead(args: argparse.Namespace, work: Path, rounds: int = 5) -> tuple[float, float]:
    """Median seconds to 'serving' for one engine: plain Popen reading its status file, against under a shim."""
    from gpuwarden.ops.engines import control
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    from gpuwarden.ops.foundation.settings import Settings
    argv = [sys.executable, str(REPO / "tests" / "engines" / "fake_engine.py"), "--register-s", "0"]
    plain, shimmed = [], []
    for r in range(rounds):
        status = work / f"plain-{r}.jsonl"
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env={**os.environ, "GPUWARDEN_STATUS_FILE": str(status)},
                             stdout=subprocess.DEVNULL)
        while not any(e.phase == "serving" for e in read_events(status)):
            time.sleep(0.002)
        plain.append(time.monotonic() - t0)
        p.terminate()
        p.wait()
        settings = Settings(state_dir=work / f"state-shim-{r}")
        t0 = time.monotonic()
        control.start(settings, EngineConfig(name="s", argv=tuple(argv), gpu=0), gate_slots=1,
                      registration_timeout=30, workdir=None)
        while (st.read_state(settings.state_dir, "s") or {}).get("phase") != "serving":
            time.sleep(0.002)
        shimmed.append(time.monotonic() - t0)
        control.stop(settings, "s", timeout_s=5)
    return statistics.median(plain), statistics.median(shimmed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--runtime", choices=("cuda", "hip", "host", "sim"), help="run canaries with this runtime")
    p.add_argument("--arena", help="arena for the canaries or torch engines")
    p.add_argument("--torch", action="store_true", help="unmodified PyTorch engines under progress = \"preload\"")
    p.add_argument("--same-gpu", action="store_true", help="every engine on GPU 0 (default: engine i on GPU i)")
    p.add_argument("--register-s", type=float, default=0.5, help="fake engines: seconds one registration takes")
    p.add_argument("--startup-s", type=float, default=0.3, help="fake engines: seconds before registering")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if (args.runtime or args.torch) and not args.arena:
        p.error("--runtime and --torch need --arena")
    work = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    try:
        write_config(work / "node.toml", args)
        burst = run_mode("burst", ["--stagger", str(args.engines)], args, work)
        gated = run_mode("gated", ["--stagger", "1"], args, work)
        seq = run_mode("sequential", ["--sequential"], args, work)
        singles = list(seq["register_s"].values()) or [float("nan")]
        single = statistics.median(singles)
        budget = burst["seconds"] + (args.engines - 1) * single
        ratio = gated["seconds"] / budget
        real = args.runtime or args.torch
        plain_s, shim_s = shim_overhead(args, work) if not real else (float("nan"), float("nan"))
        result = {
            "engines": args.engines, "runtime": "torch-preload" if args.torch else args.runtime or "fake",
            "same_gpu": args.same_gpu, "burst": burst, "gated": gated,
            "sequential": seq, "single_registration_s": round(single, 3), "target_s": round(budget * 1.1, 3),
            "gated_over_budget": round(ratio, 3), "target_met": bool(ratio <= 1.10 and gated["ok"]),
            "sequential_over_gated": round(seq["seconds"] / gated["seconds"], 3),
            "shim_start_s": round(shim_s, 3), "popen_start_s": round(plain_s, 3),
            "shim_over_popen": round(shim_s / plain_s, 3) if plain_s == plain_s else None,
            "machine": machine(),
        }
        print(f"launch to all {args.engines} serving ({result['runtime']} engines):")
        for m in (burst, gated, seq):
            regs = ", ".join(f"{v:.2f}" for v in m["register_s"].values())
            print(f"  {m['mode']:<10} {m['seconds']:7.2f} s  {'ok' if m['ok'] else 'FAILED'}   register s: {regs}")
        print(f"  one registration alone (median, sequential run): {single:.2f} s")
        print(f"  target: gated <= (burst + {args.engines - 1} x single) x 1.1 = {budget * 1.1:.2f} s -> "
              f"gated/budget = {ratio:.2f} {'MET' if result['target_met'] else 'MISSED'}")
        print(f"  sequential/gated = {result['sequential_over_gated']:.2f}")
        for m in (burst, gated, seq):
            print(f"registration timeline, {m['mode']} (seconds after the launch began, from the status events):")
            print("\n".join(m["timeline"]) or "  (no registering events)")
        if not real:
            print(f"  start-to-serving of one engine: shim {shim_s * 1000:.0f} ms vs plain Popen {plain_s * 1000:.0f} ms "
                  f"(ratio {result['shim_over_popen']:.2f})")
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
        return 0 if result["target_met"] else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
