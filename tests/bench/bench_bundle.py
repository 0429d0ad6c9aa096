"""Time to collect an incident bundle on a simulated node, against peers measured in the same run.

Node: `gpuwarden sim init --gpus 8` with 4 real `sim hold` tenants. Measured: `gpuwarden bundle` as the
operator runs it (a subprocess, interpreter start included), collect_bundle() in-process, and two peers
over the same data: `tar czf` of the very tree the bundle collected, and a plain shell `dmesg > f; cat
<the same sysfs and /proc files> > f`. Also triage throughput on a large kernel log (a fixture x300).
Target: a bundle under 5 s here. Run: .venv/bin/python tests/bench/bench_bundle.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchlib import cpu_model  # noqa: E402

from gpuwarden.ops.bundle.collect import collect_bundle  # noqa: E402
from gpuwarden.ops.foundation.settings import Settings  # noqa: E402
from gpuwarden.ops.triage import analyze_text  # noqa: E402

CLI = [sys.executable, "-m", "gpuwarden.playbooks.cli.root"]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-bench-bundle-"))
    state, out = work / "state", work / "out"
    out.mkdir()
    env = {**os.environ, "GPUWARDEN_STATE_DIR": str(state)}
    subprocess.run([*CLI, "sim", "init", "--gpus", "8", "--vram", "192GiB"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    tenants = [subprocess.Popen([*CLI, "sim", "hold", "--gpu", str(g), "--size", "20GiB"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, text=True) for g in range(4)]
    try:
        for t in tenants:
            t.stdout.readline()
        settings = Settings(state_dir=state, config_path=state / "node.toml", backend="sim")

        cli_times, api_times = [], []
        for _ in range(args.runs):
            cli_times.append(timed(lambda: subprocess.run(
                [*CLI, "--backend", "sim", "bundle", "--output", str(out), "--json"], cwd=REPO, env=env,
                check=True, capture_output=True)))
            api_times.append(timed(lambda: collect_bundle(settings, output=out)))
        last = collect_bundle(settings, output=out)

        # Peer 1: tar czf of exactly what the bundle collected.
        tree = work / "tree"
        with tarfile.open(last.path) as tf:
            tf.extractall(tree, filter="tar")
        tar_times = [timed(lambda: subprocess.run(["tar", "czf", str(work / "peer.tgz"), "-C", str(tree), "."],
                                                  check=True)) for _ in range(args.runs)]
        # Peer 2: a shell that reads the same kernel log and files, nothing else (no redaction, no triage).
        files = [i["source"] for i in last.manifest["items"] if i["kind"] == "file"]
        listing = work / "files.txt"
        listing.write_text("\n".join(files) + "\n")
        script = f"(dmesg; xargs -d '\\n' cat < {listing}) > {work / 'peer.txt'} 2>/dev/null; true"
        cat_times = [timed(lambda: subprocess.run(["sh", "-c", script], check=True)) for _ in range(args.runs)]

        log = (REPO / "tests/fixtures/dmesg/rocm5745_gfx1151_gfxhub_pagefault_mes_sq_intr_gpu_reset_mode2.log")
        big = log.read_text() * 300 if log.exists() else ""
        tri = timed(lambda: analyze_text(big)) if big else float("nan")
    finally:
        for t in tenants:
            t.terminate()
            t.wait(10)

    med = statistics.median
    cli_s, api_s, tar_s, cat_s = med(cli_times), med(api_times), med(tar_times), med(cat_times)
    print(f"machine: {os.cpu_count()} cores, {cpu_model()}")
    print(f"bundle: {len(last.manifest['items'])} files, {last.bytes / 1024:.0f} KiB compressed")
    print(f"gpuwarden bundle (CLI, median of {args.runs}):  {cli_s * 1e3:8.0f} ms   target < 5000 ms: "
          f"{'met' if cli_s < 5 else 'MISSED'}")
    print(f"collect_bundle() in-process:               {api_s * 1e3:8.0f} ms")
    print(f"peer tar czf of the same tree:             {tar_s * 1e3:8.0f} ms   bundle/peer = {api_s / tar_s:5.1f}x")
    print(f"peer dmesg + cat of the same files:        {cat_s * 1e3:8.0f} ms   bundle/peer = {api_s / cat_s:5.1f}x")
    if big:
        print(f"triage of a {len(big) / 1e6:.1f} MB kernel log ({big.count(chr(10))} lines): {tri * 1e3:.0f} ms "
              f"({big.count(chr(10)) / tri / 1e3:.0f}k lines/s)")
    print(json.dumps({"cli_ms": round(cli_s * 1e3), "api_ms": round(api_s * 1e3), "tar_ms": round(tar_s * 1e3),
                      "cat_ms": round(cat_s * 1e3)}))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
