"""gpuwarden's /metrics against nvitop-exporter on one NVIDIA node, both already running, under the same scrape
loop: latency per scrape, exporter CPU per scrape (its process CPU during the loop minus its idle rate), and
gpuwarden's VRAM series against nvidia-smi for the process holding 10 GiB. Self-checking: exit 1 on a miss.

Usage: python3 metrics_compare.py GW_URL GW_PID NVITOP_URL NVITOP_PID HOLDER_PID OUT_JSON [--scrapes N] [--idle S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of every thread of the process, in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def measure(name: str, url: str, pid: int, scrapes: int, idle_s: float) -> dict:
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(idle_s)  # what the exporter costs with nobody scraping (its own sampling loop)
    idle_rate = (cpu_s(pid) - c0) / (time.monotonic() - t0)
    for _ in range(3):
        scrape(url)
    lat = []
    c1, t1 = cpu_s(pid), time.monotonic()
    for _ in range(scrapes):
        t = time.perf_counter()
        body = scrape(url)
        lat.append((time.perf_counter() - t) * 1e3)
    wall = time.monotonic() - t1
    per_scrape = max(0.0, (cpu_s(pid) - c1) - idle_rate * wall) / scrapes
    lat.sort()
    row = {"name": name, "idle_cpu_share": idle_rate, "cpu_per_scrape_ms": per_scrape * 1e3,
           "p50_ms": statistics.median(lat), "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
           "bytes": len(body), "series": sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#")),
           "share_at_15s": idle_rate + per_scrape / 15.0}
    print(f"{name:16s} scrape p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  CPU/scrape "
          f"{row['cpu_per_scrape_ms']:7.2f} ms  idle {idle_rate * 100:5.2f}% core  at a 15s scrape "
          f"{row['share_at_15s'] * 100:5.2f}% core  ({row['series']} series, {row['bytes'] // 1024} KiB)")
    return row


def samples(body: bytes) -> list:
    return [s for fam in text_string_to_metric_families(body.decode()) for s in fam.samples]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gw_url"), ap.add_argument("gw_pid", type=int)
    ap.add_argument("nv_url"), ap.add_argument("nv_pid", type=int)
    ap.add_argument("holder_pid", type=int), ap.add_argument("out")
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--idle", type=float, default=20.0)
    args = ap.parse_args()
    rows = [measure("gpuwarden", args.gw_url, args.gw_pid, args.scrapes, args.idle),
            measure("nvitop-exporter", args.nv_url, args.nv_pid, args.scrapes, args.idle)]
    gw, nv = rows
    cheaper = gw["cpu_per_scrape_ms"] < nv["cpu_per_scrape_ms"] and gw["p50_ms"] < nv["p50_ms"]
    print(f"per scrape gpuwarden/nvitop: CPU {gw['cpu_per_scrape_ms'] / max(nv['cpu_per_scrape_ms'], 1e-9):.2f}x, "
          f"latency {gw['p50_ms'] / nv['p50_ms']:.2f}x -> {'gpuwarden cheaper' if cheaper else 'NOT CHEAPER'}")

    # VRAM: gpuwarden's series against nvidia-smi, read back to back.
    body = scrape(args.gw_url)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True).stdout
    smi_used = {int(i): int(m) for i, m in (ln.split(",") for ln in smi.splitlines() if ln.strip())}
    smi_apps = {int(p): int(m) for p, m in (ln.split(",") for ln in apps.splitlines() if ln.strip())}
    ss = samples(body)
    used = {int(s.labels["gpu"]): int(s.value) >> 20 for s in ss if s.name == "gpuwarden_gpu_vram_used_bytes"}
    mine = [s for s in ss if s.name == "gpuwarden_process_vram_bytes" and s.labels["pid"] == str(args.holder_pid)]
    holder_mib = int(mine[0].value) >> 20 if mine else None
    gpu_ok = all(abs(used.get(i, -10**9) - m) <= 2 for i, m in smi_used.items())
    holder_ok = (holder_mib is not None and smi_apps.get(args.holder_pid) is not None
                 and abs(holder_mib - smi_apps[args.holder_pid]) <= 2 and holder_mib >= 10 * 1024)
    for i in sorted(smi_used):
        print(f"GPU {i}: gpuwarden_gpu_vram_used_bytes {used.get(i)} MiB, nvidia-smi {smi_used[i]} MiB")
    print(f"holder pid {args.holder_pid}: gpuwarden_process_vram_bytes {holder_mib} MiB, nvidia-smi compute-apps "
          f"{smi_apps.get(args.holder_pid)} MiB -> {'match' if holder_ok else 'MISMATCH'}")
    ok = cheaper and gpu_ok and holder_ok
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "cheaper": cheaper, "gpu_used_mib": used, "smi_used_mib": smi_used,
                   "holder_mib": holder_mib, "smi_holder_mib": smi_apps.get(args.holder_pid), "ok": ok}, f, indent=2)
    print(f"verdict: {'PASS' if ok else 'FAIL'} (cheaper={cheaper}, GPU VRAM match={gpu_ok}, holder match={holder_ok})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
