"""Peak RSS of `gpuwarden arena create` across chunk sizes, this tree against a peer (issue 39, item 2: a
chunk-sized template plus one buffer per worker made a 1 MiB arena with 4 GiB chunks peak at 8.4 GB).

Each run is a real CLI process; its peak RSS is ru_maxrss from wait4 on that one child. The peer is skipped for
chunks above --peer-max-chunk (it would take twice the chunk in memory).

    python tests/bench/bench_arena_rss.py [--peer 20b93a9] [--peer-max-chunk 1GiB]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

REPO = Path(__file__).resolve().parents[2]
# (arena size, chunk size, workers)
CASES = [("1MiB", "1MiB", "1"), ("1MiB", "16MiB", "1"), ("1MiB", "256MiB", "1"), ("1MiB", "1GiB", "1"),
         ("1MiB", "4GiB", "1"), ("256MiB", "16MiB", "16"), ("256MiB", "64MiB", "4"), ("1GiB", "256MiB", "4")]
UNITS = {"MiB": 1 << 20, "GiB": 1 << 30}


def to_bytes(text: str) -> int:
    return int(text[:-3]) * UNITS[text[-3:]]


def peak_rss_mib(env: dict[str, str], state: Path, arena: Path, size: str, chunk: str, workers: str) -> tuple[int, float]:
    argv = [sys.executable, "-m", "gpuwarden", "--state-dir", str(state), "arena", "create", str(arena), "--size", size,
            "--chunk-size", chunk, "--workers", workers, "--force", "-q"]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default="HEAD~1", help="git ref of the code to compare with")
    ap.add_argument("--peer-max-chunk", default="1GiB", help="largest chunk the peer is run with")
    ap.add_argument("--dir", default="/dev/shm", help="where the arenas are made")
    opts = ap.parse_args()
    print(benchlib.machine_line())
    with tempfile.TemporaryDirectory(prefix="bench-arena-rss-") as tmp, \
            tempfile.TemporaryDirectory(prefix="bench-arena-rss-", dir=opts.dir) as where:
        tmp_path = Path(tmp)
        trees = benchlib.compared_trees(REPO, opts.peer, tmp_path)
        envs = {name: benchlib.linked_env(tree, tmp_path / f"pkgs-{i}") for i, (name, tree) in enumerate(trees.items())}
        print(f"| arena | chunk | workers | {' | '.join(f'{n} peak RSS' for n in envs)} |")
        print("|---|---|---|" + "---|" * len(envs))
        for size, chunk, workers in CASES:
            cells = []
            for name, env in envs.items():
                if name != "this tree" and to_bytes(chunk) > to_bytes(opts.peer_max_chunk):
                    cells.append("not run")
                    continue
                code, mib = peak_rss_mib(env, tmp_path / "state", Path(where) / "a.arena", size, chunk, workers)
                cells.append(f"{mib:,.0f} MiB" + ("" if code == 0 else f" (exit {code})"))
            print(f"| {size} | {chunk} | {workers} | {' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
