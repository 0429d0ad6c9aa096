"""What citing the catalog of known issues costs a bundle's triage, and how long `gpuwarden report` takes.

A bundle is made by collect_bundle() on a simulated node whose `dmesg` prints every real excerpt of the triage
corpus and the shared fixtures (tests/triage_corpus, tests/fixtures/dmesg, tests/fixtures/known): many rules
fire, so the matcher has real work. The same bundle is triaged in-process with the catalog (its TOML parsed
afresh each run, as a new CLI process would) and without (ops.knowledge.cite replaced by a no-op), interleaved,
median of N runs each; the ratio is the cost. `report` is timed in-process (median) and as the CLI
(interpreter start included) when the command exists.
Target: catalog matching adds <= 5% to bundle triage; report < 1 s.
Run: .venv/bin/python tests/bench/bench_known.py [--runs 15]
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "bench"))

from benchlib import machine_line  # noqa: E402


def make_bundle(work: Path) -> Path:
    from gpuwarden.ops.bundle.collect import collect_bundle
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    logs = sorted((REPO / "tests/triage_corpus").glob("*.log")) + sorted((REPO / "tests/fixtures/dmesg").iterdir()) \
        + sorted((REPO / "tests/fixtures/known").iterdir())
    storm = work / "storm.log"
    storm.write_bytes(b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs))
    bindir = work / "bin"
    bindir.mkdir()
    (bindir / "dmesg").write_text(f"#!/bin/sh\ncat {storm}\n")
    (bindir / "dmesg").chmod(0o755)
    os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ['PATH']}"
    state = work / "state"
    state.mkdir()
    SimNode(state).init(gpus=4, vram=64 << 30)
    settings = Settings(state_dir=state, config_path=state / "node.toml", backend="sim")
    return collect_bundle(settings, output=work, timeout_s=10).path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    from gpuwarden.ops import knowledge
    from gpuwarden.ops.knowledge import catalog
    from gpuwarden.ops.triage import bundle as tb
    # A new process has none of the catalog's regexes in re's cache; re.purge() would also empty triage's own
    # cache and bill its recompiling to the catalog, so the catalog's patterns are compiled past the cache instead.
    from re import _compiler  # type: ignore[attr-defined]
    plain = catalog._compile.__wrapped__

    @functools.lru_cache(maxsize=256)
    def uncached(pattern: str):
        m = plain(pattern)
        return _compiler.compile(pattern, re.IGNORECASE) if isinstance(m, re.Pattern) else m
    catalog._compile = uncached
    with tempfile.TemporaryDirectory() as tmp:
        path = make_bundle(Path(tmp))
        real_cite = tb.cite
        report = tb.triage_bundle(path)
        print(machine_line())
        print(f"bundle: {path.stat().st_size / 1024:.0f} KiB, {report.lines} kernel-log lines, "
              f"{len(report.findings)} findings, {len(report.known)} known issues cited, "
              f"catalog of {len(knowledge.load())} entries")

        def with_catalog():
            catalog.load.cache_clear()  # a new process loads the catalog and compiles its patterns: count it
            catalog._compile.cache_clear()
            tb.cite = real_cite
            tb.triage_bundle(path)

        def without():
            tb.cite = lambda report, env=None: []
            tb.triage_bundle(path)
        a, b = [], []
        for fn in (with_catalog, without):
            fn()  # warm caches (regexes, imports)
        for _ in range(args.runs):
            for fn, out in ((with_catalog, a), (without, b)):
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1e3)
        tb.cite = real_cite
        wa, wo = statistics.median(a), statistics.median(b)
        print(f"triage_bundle with the catalog: {wa:.1f} ms, without: {wo:.1f} ms (median of {args.runs}): "
              f"ratio {wa / wo:.3f} (+{100 * (wa - wo) / wo:.1f}%)")

        def matching_only():
            catalog.load.cache_clear()
            catalog._compile.cache_clear()
            knowledge.match_findings(report.ordered(), report.environment)
        m = []
        for _ in range(args.runs):
            t = time.perf_counter()
            matching_only()
            m.append((time.perf_counter() - t) * 1e3)
        print(f"catalog load + matching alone, first in a process: {statistics.median(m):.2f} ms "
              f"({100 * statistics.median(m) / wo:.1f}% of triage without it; median of {args.runs})")
        warm = []
        for _ in range(args.runs):
            t = time.perf_counter()
            knowledge.match_findings(report.ordered(), report.environment)
            warm.append((time.perf_counter() - t) * 1e3)
        print(f"matching alone, catalog loaded (the agent's case): {statistics.median(warm):.2f} ms "
              f"({100 * statistics.median(warm) / wo:.1f}%)")

        try:
            from gpuwarden.ops.bugreport import build as report_build
        except ImportError:
            report_build = None
        if report_build is not None:
            r = []
            for _ in range(args.runs):
                t = time.perf_counter()
                report_build(path)
                r.append((time.perf_counter() - t) * 1e3)
            print(f"report (in-process): {statistics.median(r):.1f} ms (median of {args.runs})")
            cli = []
            for _ in range(5):
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "gpuwarden", "report", str(path)], capture_output=True,
                                      cwd=REPO)
                cli.append(time.perf_counter() - t)
                assert proc.returncode in (0, 1), proc.stderr
            print(f"gpuwarden report BUNDLE (CLI, interpreter start included): {statistics.median(cli):.2f} s "
                  f"(median of 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
