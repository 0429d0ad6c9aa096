"""Doctor wall time on a simulated node, against peers measured in the same run.

Node: `gpuwarden sim init --gpus 8 --hive` with a node config (arena in /dev/shm, 8 engines). Measured:
`gpuwarden doctor --json` as the operator runs it (a subprocess, interpreter start included; target <= 2 s),
diagnose() in-process with the checks concurrent (what the CLI does) and the same checks run serially in one
thread (the peer: the same reads one after another), a run where NVML hangs in nvmlInit (the checks that need it
are cut at --timeout), and vendor tools as peers when installed (nvidia-smi -q, amd-smi static, rocm-smi -a).
Run: .venv/bin/python tests/bench/bench_doctor.py [--runs 30]
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
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from benchlib import machine_line  # noqa: E402

from gpuwarden.ops.doctor.checks import REGISTRY  # noqa: E402
from gpuwarden.ops.doctor.diagnose import diagnose  # noqa: E402
from gpuwarden.ops.doctor.probe import CheckIO, Probe  # noqa: E402
from gpuwarden.ops.doctor.runner import run_checks  # noqa: E402
from gpuwarden.ops.foundation.settings import Settings  # noqa: E402

CLI = [sys.executable, "-m", "gpuwarden.tui.main"]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def stats(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"median {statistics.median(xs) * 1e3:7.1f} ms  p90 {xs[int(0.9 * (len(xs) - 1))] * 1e3:7.1f}  " \
           f"min {xs[0] * 1e3:6.1f}  max {xs[-1] * 1e3:7.1f}"


def serial(settings: Settings) -> None:
    probe = Probe(settings)
    for check in REGISTRY:
        try:
            check.run(CheckIO(probe))
        except Exception:
            pass


def shell_reads(report, settings: Settings) -> list[str]:
    """The files the report says it read, as one `cat` in a shell: an operator's hand-run checklist."""
    sim_sys = str(settings.state_dir / "sim" / "root" / "sys")
    paths = []
    for f in report.findings:
        for r in f.read:
            if r.startswith(("/sys/class/drm", "/sys/class/kfd", "/sys/module")):
                paths.append(sim_sys + r[len("/sys"):])
            elif r.startswith(("/sys/", "/proc/", "/etc/", "/boot/", "/opt/")) and "<pid>" not in r:
                paths.append(r)
    return ["sh", "-c", "cat " + " ".join(sorted(set(paths))) + " >/dev/null 2>&1; true"]


def hung_nvml(settings: Settings, timeout_s: float | None) -> float:
    """diagnose() with the NVIDIA driver present and an NVML whose nvmlInit never returns."""
    from standins import nvsmi_capture, pynvml_standin
    fixtures = REPO / "tests" / "fixtures" / "nvidia"
    module = pynvml_standin.build(nvsmi_capture.parse_q(fixtures / "nvidia_smi_q_text_8x_h100_sxm_565.txt"))
    stuck = threading.Event()
    module.nvmlInit = lambda: stuck.wait(120)
    sim_sys = settings.state_dir / "sim" / "root" / "sys"
    (sim_sys / "module/nvidia").mkdir(parents=True, exist_ok=True)
    (sim_sys / "module/nvidia/version").write_text("565.57.01\n")
    try:
        probe = Probe(settings, extra={"pynvml": module})
        t = time.perf_counter()
        report = run_checks(list(REGISTRY), probe, timeout_s=timeout_s)
        took = time.perf_counter() - t
        cut = [f.id for f in report.findings if f.timed_out]
        limit = f"{timeout_s:g} s for every check" if timeout_s else "default timeouts: NVML checks 4 s"
        print(f"  hung NVML ({limit}): whole run {took * 1e3:.0f} ms, cut: {', '.join(cut)}")
        return took
    finally:
        stuck.set()
        (sim_sys / "module/nvidia/version").unlink()
        (sim_sys / "module/nvidia").rmdir()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-bench-doctor-"))
    state = work / "state"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}, "GPUWARDEN_STATE_DIR": str(state)}
    subprocess.run([*CLI, "sim", "init", "--gpus", "8", "--vram", "192G", "--hive"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    config = state / "node.toml"
    engines = "".join(f'[[engines]]\nname = "dp{i}"\ngpu = {i}\nargv = ["/bin/sleep", "600"]\n\n' for i in range(8))
    config.write_text(f'[arena]\npath = "/dev/shm/gw-bench-doctor.arena"\nsize = "1GiB"\n\n{engines}')
    env["GPUWARDEN_CONFIG"] = str(config)
    settings = Settings(state_dir=state, config_path=config, backend="sim")
    print(machine_line())
    print(f"sim node: 8 GPUs in one XGMI hive, {len(REGISTRY)} checks, config with an arena and 8 engines")
    try:
        cli = [timed(lambda: subprocess.run([*CLI, "doctor", "--json"], cwd=REPO, env=env, capture_output=True))
               for _ in range(max(5, args.runs // 3))]
        report = diagnose(settings)
        concurrent = [timed(lambda: diagnose(settings)) for _ in range(args.runs)]
        one_by_one = [timed(lambda: serial(settings)) for _ in range(args.runs)]
        print(f"  gpuwarden doctor --json (CLI)   {stats(cli)}")
        print(f"  diagnose(), checks concurrent   {stats(concurrent)}")
        print(f"  same checks serially (peer)     {stats(one_by_one)}")
        cat = shell_reads(report, settings)
        by_hand = [timed(lambda: subprocess.run(cat)) for _ in range(args.runs)]
        print(f"  the same files, one shell `cat`  {stats(by_hand)}  ({len(cat[2].split()) - 5} paths/globs)")
        ratio = statistics.median(concurrent) / statistics.median(one_by_one)
        print(f"  concurrent / serial = {ratio:.2f}; verdicts: {report.counts()}")
        slow = sorted(report.findings, key=lambda f: -f.duration_s)[:3]
        print("  slowest checks: " + ", ".join(f"{f.id} {f.duration_s * 1e3:.1f} ms" for f in slow))
        hung = {"default": hung_nvml(settings, None), "1.5": hung_nvml(settings, 1.5)}
        peers = {}
        for name, argv in (("nvidia-smi -q", ["nvidia-smi", "-q"]), ("amd-smi static", ["amd-smi", "static"]),
                           ("rocm-smi -a", ["rocm-smi", "-a"])):
            if shutil.which(argv[0]):
                peers[name] = [timed(lambda argv=argv: subprocess.run(argv, capture_output=True)) for _ in range(5)]
                print(f"  {name:<30}  {stats(peers[name])}")
            else:
                print(f"  {name:<30}  not installed here")
        result = {"cli_s": cli, "concurrent_s": concurrent, "serial_s": one_by_one, "shell_cat_s": by_hand,
                  "hung_nvml_s": hung,
                  "peers_s": peers, "counts": report.counts()}
        (work / "bench_doctor.json").write_text(json.dumps(result, indent=1))
        print(f"  figures in {work / 'bench_doctor.json'}")
    finally:
        shutil.rmtree(state / "sim", ignore_errors=True)


if __name__ == "__main__":
    main()
