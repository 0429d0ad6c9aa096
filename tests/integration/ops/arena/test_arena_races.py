"""Arena create and verify against what happens while they run (issue 25 item 7): a write to the file during
verify, a path that is no file to verify (/proc/self/mem) under --json, and a signal at each point of create.

Real files; the signals are real, sent by the process to itself at a chosen point (a wrapped os call in a
child process running the real CLI), so each race is hit every time instead of by timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.ops.arena import format as fmt
from gpuwarden.ops.arena.create import create
from gpuwarden.ops.arena.verify import _unchanged, verify
from helpers.paths import REPO

MiB = 1 << 20


@pytest.fixture
def arena(tmp_path: Path) -> Path:
    path = tmp_path / "w.arena"
    create(path, size=8 * MiB, chunk_size=MiB, workers=2)
    return path


def overwrite_first_mib(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        header = fmt.load_header(path)
        os.pwrite(fd, b"\xa5" * MiB, header.header_size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("method", ["pread", "mmap"])
def test_an_overwrite_of_the_first_mib_during_verify_is_no_ok(arena, method):
    """The overwrite lands once every chunk has been hashed (the last progress report), as in the 4 runs of
    16 that said ok: the chunks were read before the write."""
    def progress(done: int, total: int) -> None:
        if done == total:
            overwrite_first_mib(arena)
    with pytest.raises(fmt.ArenaError) as caught:
        verify(arena, workers=2, method=method, progress=progress)
    exc = caught.value
    assert exc.kind == "changed" and exc.exit_code == 1
    assert f"{arena} changed while it was being verified" in exc.message, exc.message
    assert "chunk 0" in exc.message and "it was written" in exc.message, exc.message
    with pytest.raises(fmt.ArenaError, match="chunk 0 of 8 is corrupt"):  # and a fresh pass names the damage
        verify(arena, workers=2, method=method)


def test_a_write_that_moves_no_timestamp_is_caught_by_the_second_hash(arena):
    """Chunk 0 hashed again after the pass: `before` taken after the write stands for a writer whose change
    no timestamp shows."""
    overwrite_first_mib(arena)
    fd = os.open(arena, os.O_RDONLY)
    try:
        header = fmt.read_header(fd, arena)
        with pytest.raises(fmt.ArenaError, match="chunk 0 .* no longer matches the hash it had"):
            _unchanged(fd, arena, header, fmt.read_raw_header(fd, header), os.fstat(fd), 2)
    finally:
        os.close(fd)


def test_a_file_replaced_by_a_rename_during_verify_is_said(arena, tmp_path):
    other = tmp_path / "other.arena"
    create(other, size=8 * MiB, chunk_size=MiB, workers=2)

    def progress(done: int, total: int) -> None:
        if done == total and other.exists():
            os.replace(other, arena)
    with pytest.raises(fmt.ArenaError, match="the path now names another file"):
        verify(arena, workers=2, progress=progress)


def test_an_untouched_arena_still_verifies(arena):
    assert verify(arena, workers=2).header.payload_size == 8 * MiB


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.parametrize("path", ["/proc/self/mem", "/dev/null", "{fifo}", "{dir}"])
def test_verify_json_is_json_naming_the_path_on_every_error(tmp_path, path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path = path.format(fifo=fifo, dir=tmp_path)
    proc = cli("--state-dir", str(tmp_path / "s"), "arena", "verify", "--json", path)
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "gpuwarden.arena-error/1" and doc["path"] == path and path in doc["error"], doc
    assert proc.returncode == doc["exit_code"] == 2 and doc["kind"] == "unreadable", doc
    assert "Traceback" not in proc.stderr


# --- a signal at each point of `arena create` --------------------------------------------------------------

DRIVER = """
import os, signal, sys
from gpuwarden.tui.main import main
where, sig = sys.argv[1], getattr(signal, sys.argv[2])
real = getattr(os, where)
# As from an interactive terminal: a runner that started pytest in the background (nohup, `&` in a script) leaves
# SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)

sent = []

def wrapped(*args):
    if sent:
        return real(*args)
    sent.append(True)
    if where == "replace":  # the rename that completes the arena, then the signal
        real(*args)
        os.kill(os.getpid(), sig)
        return None
    os.kill(os.getpid(), sig)  # the signal, while the partial file is being written (or the arena read)
    return real(*args)
setattr(os, where, wrapped)
sys.exit(main(sys.argv[3:]))
"""


def create_signalled(tmp_path: Path, where: str, sig: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    arena = tmp_path / "w.arena"
    proc = subprocess.run([sys.executable, "-c", DRIVER, where, sig, "--state-dir", str(tmp_path / "s"), "arena",
                           "create", str(arena), "--size", "8MiB", "--chunk-size", "1MiB", "-q", *extra],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    return proc, arena


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_right_after_the_rename_reports_the_complete_arena(tmp_path, sig):
    proc, arena = create_signalled(tmp_path, "replace", sig)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert f"created {arena}" in proc.stdout, proc.stdout
    said = "interrupted" if sig == "SIGINT" else f"{sig} came"
    assert f"gpuwarden: {said} after the arena was created: {arena} is complete" in proc.stderr, proc.stderr
    assert verify(arena, workers=2).header.payload_size == 8 * MiB
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    journal = (tmp_path / "s" / "journal.log").read_text()
    assert '"arena create"' in journal and '"ok"' in journal, journal


def test_json_after_the_rename_is_the_created_document(tmp_path):
    proc, arena = create_signalled(tmp_path, "replace", "SIGINT", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["path"] == str(arena), (proc.stdout, proc.stderr)
    assert "after the arena was created" in proc.stderr


@pytest.mark.parametrize("where, sig, code", [("fsync", "SIGINT", 130), ("posix_fallocate", "SIGTERM", 143)])
@pytest.mark.parametrize("json_out", [False, True])
def test_a_signal_before_the_rename_leaves_nothing(tmp_path, where, sig, code, json_out):
    proc, arena = create_signalled(tmp_path, where, sig, *(["--json"] if json_out else []))
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert not arena.exists() and [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    assert "created" not in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    if json_out:  # still one document, naming the arena
        doc = json.loads(proc.stdout)
        assert doc["kind"] == "interrupted" and doc["path"] == str(arena) and doc["exit_code"] == code, doc


def test_verify_json_interrupted_is_a_document(arena):
    proc = subprocess.run([sys.executable, "-c", DRIVER, "preadv", "SIGINT", "--state-dir", str(arena.parent / "s"),
                           "arena", "verify", "--json", "--workers", "1", str(arena)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 130, (proc.stdout, proc.stderr)
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "interrupted" and doc["path"] == str(arena) and doc["exit_code"] == 130, doc
