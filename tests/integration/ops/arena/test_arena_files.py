"""Arena files end to end through the real CLI: create, verify, inspect, and every one-line refusal.

Real files on disk and tmpfs; the byte flipped on disk must be found in the right chunk at the right offset.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

MiB = 1 << 20


def make(cli, path: Path, size: str = "5MiB", chunk: str = "1MiB", *extra: str) -> dict:
    proc = cli("arena", "create", str(path), "--size", size, "--chunk-size", chunk, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("gpuwarden: error: ") and needle in first, proc.stderr


def test_create_verify_inspect_roundtrip(cli, tmp_path):
    path = tmp_path / "w.arena"
    made = make(cli, path, "5MiB", "1MiB")
    assert made["payload_size"] == 5 * MiB and made["chunk_count"] == 5 and made["header_size"] == 4096
    assert path.stat().st_size == 4096 + 5 * MiB
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary file left behind"
    ok = cli("arena", "verify", str(path), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    text = cli("arena", "verify", str(path))
    assert text.returncode == 0 and text.stdout.startswith("ok: ")
    info = json.loads(cli("arena", "inspect", str(path), "--json").stdout)
    assert info["header_state"] == "ok" and info["mappers"] == [] and info["hash"] == "xxh3_64"


@pytest.mark.parametrize("offset", [0, 1 * MiB + 12345, 5 * MiB + 100])
def test_one_flipped_byte_is_found_at_its_chunk(cli, tmp_path, offset):
    path = tmp_path / "w.arena"
    make(cli, path, f"{5 * MiB + 200}B", "1MiB")
    flip(path, 4096 + offset)
    chunk = offset // MiB
    proc = cli("arena", "verify", str(path), "--json")
    assert proc.returncode == 1
    bad = json.loads(proc.stdout)
    assert bad["kind"] == "hash-mismatch" and bad["chunk"] == chunk
    assert bad["payload_offset"] == chunk * MiB and bad["file_offset"] == 4096 + chunk * MiB
    assert bad["payload_offset"] <= offset < bad["payload_offset"] + bad["length"]
    text = cli("arena", "verify", str(path))
    one_line_error(text, f"chunk {chunk} of 6 is corrupt")
    assert f"file offset {4096 + chunk * MiB}" in text.stderr


def test_first_of_two_bad_chunks_is_named(cli, tmp_path):
    path = tmp_path / "w.arena"
    make(cli, path, "8MiB", "1MiB")
    flip(path, 4096 + 6 * MiB + 7)
    flip(path, 4096 + 2 * MiB + 7)
    for method in ("pread", "mmap"):
        bad = json.loads(cli("arena", "verify", str(path), "--json", "--method", method).stdout)
        assert bad["chunk"] == 2, method


def test_truncated_file_is_refused(cli, tmp_path):
    path = tmp_path / "w.arena"
    make(cli, path)
    os.truncate(path, path.stat().st_size - 1)
    proc = cli("arena", "verify", str(path))
    assert proc.returncode == 1
    one_line_error(proc, "is truncated")
    os.truncate(path, 100)
    one_line_error(cli("arena", "verify", str(path)), "truncated inside its header")
    info = json.loads(cli("arena", "inspect", str(path), "--json").stdout)
    assert info["header_state"] == "truncated"


def test_bad_magic_newer_version_bad_header_size_mismatch(cli, tmp_path):
    path = tmp_path / "w.arena"
    make(cli, path)
    original = path.read_bytes()

    path.write_bytes(b"NOTARENA" + original[8:])
    proc = cli("arena", "verify", str(path))
    assert proc.returncode == 1
    one_line_error(proc, "not a gpuwarden arena")

    path.write_bytes(original[:8] + struct.pack("<I", 7) + original[12:])
    one_line_error(cli("arena", "verify", str(path)), "format version 7; this gpuwarden reads up to 1")

    path.write_bytes(original[:130] + bytes([original[130] ^ 1]) + original[131:])  # inside the chunk table
    one_line_error(cli("arena", "verify", str(path)), "header's own hash does not match")

    path.write_bytes(original + b"extra")
    proc = cli("arena", "verify", str(path), "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["kind"] == "size-mismatch"

    path.write_bytes(original)
    proc = cli("arena", "verify", str(path), "--size", "6MiB")
    assert proc.returncode == 1
    one_line_error(proc, "expected 6291456")


def test_missing_file_and_existing_target(cli, tmp_path):
    proc = cli("arena", "verify", str(tmp_path / "nope.arena"))
    assert proc.returncode == 2
    one_line_error(proc, "does not exist")
    path = tmp_path / "w.arena"
    make(cli, path)
    again = cli("arena", "create", str(path), "--size", "1MiB")
    assert again.returncode == 2
    one_line_error(again, "already exists")
    assert cli("arena", "create", str(path), "--size", "2MiB", "--force").returncode == 0


def _without_dac(argv: list[str]) -> list[str]:
    """Run argv as root minus the capabilities that bypass file modes (the test machine runs as root)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", *argv]


def test_no_permission_is_one_line(tmp_path, state_dir):
    import shutil
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("as root this needs setpriv (util-linux) to drop the capabilities that bypass file modes")
    path = tmp_path / "w.arena"
    subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "arena", "create",
                    str(path), "--size", "1MiB"], cwd=REPO, check=True, capture_output=True)
    path.chmod(0)
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    ro_dir.chmod(0o555)
    base = [sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "arena"]
    proc = subprocess.run(_without_dac(base + ["verify", str(path)]), cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    one_line_error(proc, "no permission to read arena")
    proc = subprocess.run(_without_dac(base + ["create", str(ro_dir / "x.arena"), "--size", "1MiB"]),
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    one_line_error(proc, "no permission to create arena")


def test_full_tmpfs_leaves_nothing_behind(cli, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        proc = cli("arena", "create", str(mnt / "w.arena"), "--size", "16MiB")
        assert proc.returncode == 2
        one_line_error(proc, "no space left for a 16.0 MiB arena")
        assert "nothing was left behind" in proc.stderr
        assert list(mnt.iterdir()) == []
        assert make(cli, mnt / "ok.arena", "2MiB")["payload_size"] == 2 * MiB
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_create_from_file_copies_bytes(cli, tmp_path):
    src = tmp_path / "weights.bin"
    src.write_bytes(os.urandom(3 * MiB + 17))
    path = tmp_path / "w.arena"
    proc = cli("arena", "create", str(path), "--from", str(src), "--chunk-size", "1MiB", "--json")
    assert proc.returncode == 0, proc.stderr
    assert path.read_bytes()[4096:] == src.read_bytes()
    assert cli("arena", "verify", str(path)).returncode == 0


def test_progress_on_a_terminal_only(tmp_path, state_dir):
    """On a terminal, verify draws a progress line on stderr; piped, it prints none."""
    import pty
    path = tmp_path / "w.arena"
    subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "arena", "create",
                    str(path), "--size", "64MiB", "-q"], cwd=REPO, check=True, capture_output=True)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "arena", "verify",
                             str(path)], cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        seen += data
    os.close(master)
    assert proc.wait(30) == 0
    assert b"verifying" in seen and b"100.0%" in seen and b"GB/s" in seen
    assert proc.stdout.read().startswith(b"ok: ")
    piped = subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "arena", "verify",
                            str(path)], cwd=REPO, capture_output=True)
    assert piped.returncode == 0 and piped.stderr == b""


def test_killed_create_leaves_a_partial_the_next_create_sweeps(cli, tmp_path, state_dir):
    import signal
    import time
    path = tmp_path / "big.arena"
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "arena", "create",
                             str(path), "--size", "1GiB", "--workers", "1"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    partial = tmp_path / f".big.arena.partial-{proc.pid}"
    deadline = time.monotonic() + 30
    while not partial.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not partial.exists():
        pytest.skip("create finished before it could be killed")
    assert not path.exists(), "a killed create must not leave the final name"
    make(cli, path, "1MiB")
    assert not partial.exists()
