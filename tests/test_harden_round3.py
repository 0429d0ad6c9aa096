"""Hostile input, round 3 (issue 39): each item's regression, run through the real CLI (and real sockets,
files and processes) where the item is about what a user sees.

Items: 1-2 arena options, 3 one bundle reader, 4 pipelining clients, 5 secrets, 6 GPU indexes and option
values, 7 the fleet's SSH config.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO


def refused(proc: subprocess.CompletedProcess, needle: str) -> None:
    """Exit 2, one error line naming what was wrong, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Error:" not in proc.stderr.replace("error:", ""), proc.stderr
    assert needle in proc.stderr, proc.stderr


# --- items 1 and 2: arena create's chunk size and workers ----------------------------------------------

@pytest.mark.parametrize("chunk", ["99999PiB", "9999999999999999999999TiB", "2TiB"])
def test_an_absurd_chunk_size_is_refused_not_a_traceback(cli, tmp_path, chunk):
    proc = cli("arena", "create", str(tmp_path / "a.arena"), "--size", "1MiB", "--chunk-size", chunk)
    refused(proc, "chunk size")
    assert not list(tmp_path.glob("*a.arena*"))


def _peak_rss_kib(argv: list[str]) -> tuple[int, int]:
    """Run argv to its end; (exit status, the child's peak RSS in KiB) from wait4 on that one child."""
    child = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_maxrss


def test_a_chunk_larger_than_the_arena_costs_no_memory(state_dir, tmp_path):
    # Before the fix: a 256 MiB template plus a 256 MiB buffer for a 1 MiB arena (over 500 MB peak).
    arena = tmp_path / "a.arena"
    code, rss = _peak_rss_kib([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir),
                               "arena", "create", str(arena), "--size", "1MiB", "--chunk-size", "256MiB", "-q"])
    assert code == 0
    assert rss < 150 * 1024, f"peak RSS {rss} KiB for a 1 MiB arena"
    from gpuwarden.ops.arena.verify import verify
    done = verify(arena)
    assert done.header.chunk_size == 1 << 20 and done.header.chunk_count == 1


def test_big_chunks_on_many_workers_stay_within_the_budget(state_dir, tmp_path):
    # 4 chunks of 16 MiB on 4 workers: before, one 16 MiB template and four 16 MiB buffers (80 MiB).
    arena = tmp_path / "a.arena"
    code, rss = _peak_rss_kib([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir),
                               "arena", "create", str(arena), "--size", "64MiB", "--chunk-size", "16MiB",
                               "--workers", "4", "-q"])
    assert code == 0 and rss < 75 * 1024, rss
    from gpuwarden.ops.arena.verify import verify
    assert verify(arena, workers=2).header.chunk_count == 4


@pytest.mark.parametrize("workers", ["0", "-1", "100000"])
def test_workers_out_of_range_are_refused(cli, tmp_path, workers):
    refused(cli("arena", "create", str(tmp_path / "a.arena"), "--size", "1MiB", "--workers", workers), "--workers")
    assert not list(tmp_path.glob("*a.arena*"))


def test_verify_workers_and_an_empty_size_are_refused(cli, tmp_path):
    arena = tmp_path / "a.arena"
    assert cli("arena", "create", str(arena), "--size", "1MiB", "-q").returncode == 0
    refused(cli("arena", "verify", str(arena), "--workers", "0"), "--workers")
    refused(cli("arena", "verify", str(arena), "--size", ""), "cannot read size ''")
