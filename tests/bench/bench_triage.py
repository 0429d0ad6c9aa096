"""Triage throughput on 200 MB kernel logs and the time to triage a bundle, against peers in the same run.

Logs (built here, deterministic): `node` is a long node log, quiet lines with GPU incidents from the corpus
(tests/triage_corpus) spread through it (about 1 line in 100); `storm` is nothing but incidents (the corpus
and the shared fixtures repeated verbatim), the worst case; `storm-fresh` is the same storm with every hex
address (0x and 6+ digits) drawn anew and dmesg stamps moving on, so messages rarely repeat exactly (a page-fault
storm's addresses differ line to line). Each run is its own process, which reports its own CPU seconds
(user + sys: one core) and peak RSS.
Peers over the same file: `grep -c -i -F -f` with every literal the rules need (a lower bound: it only counts
candidate lines); a node-scraper-style loop (every rule's regex tried on every line, no prefilter), timed on
the first 20 MB and scaled; `--peer REF`: the triage of another commit (git archive) on the same file; and two
floors, the least CPython work that looks at every line: `split` (read in 4 MiB chunks, split, decode each
line) and `parse` (that, plus this tree's prefix parse of each line and one dict lookup of its message: the
stamp and message any triage that reads every line needs). This tree's triage runs twice: with its compiled
line parser (native/triage/lines.c, where built) and with the pure-Python one (GPUWARDEN_TRIAGE_PURE=1).
Bundle: one made by collect_bundle() on a simulated node (with this host's kernel log), triaged in-process
(median of 5) and by the CLI (`gpuwarden triage BUNDLE`, interpreter start included).
Targets: 200 MB in <= 5 s on one core with bounded memory; a bundle in <= 1 s.
Run: .venv/bin/python tests/bench/bench_triage.py [--mb 200] [--keep DIR] [--peer REF] [--kinds node,storm]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import benchlib  # noqa: E402
from benchlib import machine_line  # noqa: E402

from gpuwarden.ops.triage import lineparse  # noqa: E402

CORPUS = REPO / "tests" / "triage_corpus"
SHARED = REPO / "tests" / "fixtures" / "dmesg"
QUIET = (  # ordinary kernel chatter of a busy node
    "usb 1-1: new high-speed USB device number {n} using xhci_hcd",
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth{n:07x}: link becomes ready",
    "docker0: port {p}(veth{n:07x}) entered forwarding state",
    "audit: type=1400 audit({n}.123:45): apparmor=\"STATUS\" operation=\"profile_load\" profile=\"unconfined\" "
    "name=\"snap.lxd.hook\" pid={p} comm=\"apparmor_parser\"",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "systemd[1]: Started session-{p}.scope - Session {p} of User ubuntu.",
    "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
    "nvme nvme0: 32/0/0 default/read/poll queues",
    "amdgpu 0000:c1:00.0: amdgpu: ring comp_1.{p}.0 uses VM inv eng {n} on hub 0",
    "perf: interrupt took too long ({n} > {p}), lowering kernel.perf_event_max_sample_rate to 79750",
    "TCP: request_sock_TCP: Possible SYN flooding on port 8000. Sending cookies.",
)


def _incidents() -> list[list[str]]:
    out = [p.read_text(errors="replace").splitlines() for p in sorted(CORPUS.glob("*.log"))]
    if SHARED.is_dir():
        out += [p.read_text(errors="replace").splitlines() for p in sorted(SHARED.iterdir())]
    return out


_HEX = re.compile(r"0x[0-9a-fA-F]{6,}")
_MONO = re.compile(r"^\[\s*\d+\.\d+\]")


def build(path: Path, mb: int, kind: str) -> None:
    rnd = random.Random(15)
    incidents = _incidents()
    target = mb << 20
    written, t = 0, 1000.0
    storm = kind.startswith("storm")
    fresh = kind == "storm-fresh"

    def new_hex(m: re.Match) -> str:
        return "0x" + "".join(rnd.choice("0123456789abcdef") for _ in range(len(m.group()) - 2))

    with open(path, "w") as f:
        while written < target:
            if storm or rnd.random() < 0.004:
                block = rnd.choice(incidents)
            else:
                block = [rnd.choice(QUIET).format(n=rnd.randrange(1 << 16), p=rnd.randrange(1, 64))]
            for line in block:
                t += 0.001
                if fresh:
                    text = _MONO.sub(f"[{t:12.6f}]", _HEX.sub(new_hex, line), count=1)
                else:
                    text = line if storm or line.startswith(("[", "kernel")) else f"[{t:12.6f}] {line}"
                f.write(text + "\n")
                written += len(text) + 1


# Appended to every child's code: it reports its own CPU seconds and peak RSS (KiB) as its last line.
_USAGE = ("\nimport resource as _r, json as _j; _u = _r.getrusage(_r.RUSAGE_SELF)\n"
          "print(_j.dumps([_u.ru_utime + _u.ru_stime, _u.ru_maxrss]))")


def child(code: str, *args: str, root: Path = REPO, env: dict[str, str] | None = None) -> tuple[float, float, int, str]:
    """(wall s, CPU s, peak RSS KiB, stdout) of a child python running `code` in the tree at root."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + _USAGE, *args], cwd=root, capture_output=True, text=True,
                          check=True, env=env)
    wall = time.perf_counter() - t0
    *out, usage = proc.stdout.strip().splitlines()
    cpu, rss = json.loads(usage)
    return wall, cpu, rss, "\n".join(out)


TRIAGE = ("import sys; from gpuwarden.ops.triage import analyze_file; r = analyze_file(sys.argv[1]); "
          "print(len(r.findings), r.lines, r.headline())")
NAIVE = ("import sys, itertools; from gpuwarden.ops.triage.patterns import RULES; from gpuwarden.ops.triage.engine import RULES as E; "
         "rules = RULES + E; n = 0\n"
         "with open(sys.argv[1], errors='replace') as f:\n"
         "    for line in itertools.islice(f, int(sys.argv[2])):\n"
         "        n += sum(1 for r in rules if r.regex.search(line))\n"
         "print(n)")
# The floors: every line split out and decoded; then its prefix parsed and its message looked up and counted.
FLOOR = ("import sys; from gpuwarden.ops.triage.logline import LineParser\n"
         "parse = LineParser().parse if sys.argv[2] == 'parse' else None; seen = {}; n = 0\n"
         "with open(sys.argv[1], 'rb') as f:\n"
         "    while chunk := f.read(4 << 20):\n"
         "        for raw in chunk.split(b'\\n'):\n"
         "            n += 1; text = raw.decode('utf-8', 'replace')\n"
         "            if parse:\n"
         "                msg = parse(n, text).message; seen[msg] = seen.get(msg, 0) + 1\n"
         "                if len(seen) > 4096: seen.clear()\n"
         "print(n)")


def grep_peer(path: Path, tmp: Path) -> tuple[float, int]:
    from gpuwarden.ops.triage.analyze import Analyzer
    from gpuwarden.ops.triage.stream import trigger_literals
    pats = tmp / "literals.txt"
    pats.write_text("\n".join(trigger_literals(Analyzer())) + "\n")
    t0 = time.perf_counter()
    proc = subprocess.run(["grep", "-c", "-i", "-F", "-f", str(pats), str(path)], capture_output=True, text=True)
    return time.perf_counter() - t0, int(proc.stdout.strip() or 0)


def bundle_times(tmp: Path) -> dict:
    from gpuwarden.ops.bundle.collect import collect_bundle
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    from gpuwarden.ops.bundle.triage_file import triage_bundle
    state = Path(tempfile.mkdtemp(prefix="state-", dir=tmp))  # fresh each run, also under a kept --keep folder
    SimNode(state).init(gpus=8, vram=24 << 30)
    settings = Settings(state_dir=state, backend="sim")
    result = collect_bundle(settings, output=state / "b.tar.gz", safe_mode=True, timeout_s=10)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        report = triage_bundle(result.path)
        runs.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "triage", str(result.path)], cwd=REPO, capture_output=True)
    cli = time.perf_counter() - t0
    return {"bundle_bytes": result.bytes, "kernel_lines": report.lines, "in_process_s": statistics.median(runs),
            "cli_s": cli}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--keep", type=Path, help="build the logs in this folder and keep them")
    ap.add_argument("--peer", help="git ref whose triage runs on the same logs (e.g. the commit before a change)")
    ap.add_argument("--kinds", default="node,storm,storm-fresh", help="logs to build and triage (comma-separated)")
    args = ap.parse_args()
    print(machine_line())
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="bench-triage-"))
    tmp.mkdir(parents=True, exist_ok=True)
    peer_root = benchlib.export_tree(REPO, args.peer, Path(tempfile.mkdtemp(prefix="bench-triage-peer-"))) \
        if args.peer else None
    # The peer's children import the peer's gpuwarden (PYTHONPATH before the editable install's finder); without
    # it they ran this tree's code from the peer's folder (so did this bench's peer figures before 2026-12-05).
    peer_env = benchlib.linked_env(peer_root, peer_root.parent / "pkgs") if peer_root is not None else None
    out: dict[str, object] = {"machine": benchlib.machine()}
    for kind in args.kinds.split(","):
        path = tmp / f"{kind}.log"
        if not path.exists():
            build(path, args.mb, kind)
        size = path.stat().st_size
        lines = sum(1 for _ in open(path, "rb"))
        row: dict[str, object] = {"mb": round(size / 2**20), "lines": lines, "load_before": benchlib.load()}
        wall, cpu, rss, got = child(TRIAGE, str(path))
        row.update(triage_cpu_s=round(cpu, 2), triage_wall_s=round(wall, 2), peak_rss_mib=round(rss / 1024),
                   result=got, us_per_line=round(cpu / lines * 1e6, 2))
        print(f"{kind}: {size / 2**20:.0f} MiB, {lines} lines: triage {cpu:.2f} s CPU ({wall:.2f} s wall, "
              f"{cpu / lines * 1e6:.2f} us a line), peak RSS {rss / 1024:.0f} MiB", flush=True)
        # the same triage on its pure-Python line parser (ops/triage/lineparse.py's fallback), same file, same run
        pure_env = {**os.environ, "GPUWARDEN_TRIAGE_PURE": "1"}
        _, ucpu, _, ugot = child(TRIAGE, str(path), env=pure_env)
        row.update(compiled=lineparse.COMPILED, pure_cpu_s=round(ucpu, 2), pure_same_result=ugot == got)
        print(f"  pure-Python line parser: {ucpu:.2f} s CPU; compiled one built here: {lineparse.COMPILED}; same "
              f"findings/lines/headline: {ugot == got}", flush=True)
        for floor in ("split", "parse"):
            _, fcpu, frss, _ = child(FLOOR, str(path), floor)
            row[f"floor_{floor}_cpu_s"] = round(fcpu, 2)
            print(f"  floor '{floor}': {fcpu:.2f} s CPU ({fcpu / lines * 1e6:.2f} us a line), triage / floor "
                  f"{cpu / fcpu:.2f} (pure-Python parser {ucpu / fcpu:.2f})", flush=True)
        if peer_root is not None:
            pwall, pcpu, prss, pgot = child(TRIAGE, str(path), root=peer_root, env=peer_env)
            row.update(peer=args.peer, peer_cpu_s=round(pcpu, 2), peer_wall_s=round(pwall, 2),
                       peer_rss_mib=round(prss / 1024), peer_result=pgot, peer_same_result=pgot == got)
            print(f"  peer {args.peer}: {pcpu:.2f} s CPU ({pwall:.2f} s wall), peak RSS {prss / 1024:.0f} MiB -> "
                  f"this tree takes {cpu / pcpu:.2f}x its CPU; same findings/lines/headline: {pgot == got}",
                  flush=True)
        gwall, gcount = grep_peer(path, tmp)
        sample = min(lines, (20 << 20) // max(1, size // lines))
        _, ncpu, _, _ = child(NAIVE, str(path), str(sample))
        naive_cpu = ncpu * lines / sample
        row.update(grep_s=round(gwall, 2), grep_candidate_lines=gcount, naive_loop_cpu_s_scaled=round(naive_cpu, 1),
                   load_after=benchlib.load())
        print(f"  grep -c -F over the rule literals {gwall:.2f} s ({gcount} candidate lines); every regex on every "
              f"line {naive_cpu:.0f} s CPU (scaled from {sample} lines) -> {naive_cpu / cpu:.0f}x triage", flush=True)
        out[kind] = row
    b = bundle_times(tmp)
    out["bundle"] = b
    print(f"bundle: {b['bundle_bytes'] / 1024:.0f} KiB ({b['kernel_lines']} kernel lines): triage in-process "
          f"{b['in_process_s'] * 1e3:.0f} ms (median of 5), CLI end to end {b['cli_s']:.2f} s")
    print(json.dumps(out))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    if peer_root is not None:
        shutil.rmtree(peer_root.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
