"""Hostile files given to triage and `status --bundle` (issue 25 item 7): a gzip cut short or corrupt, a snapshot
nested 100,000 deep, a member claiming an absurd size, a decompression bomb, a log still being written.

Real files and the real CLI; a bundle made by the real collector on the sim node, then damaged.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from helpers.cli import gpuwarden
from helpers.bundles import real_bundle  # noqa: F401  (a fixture: the tests below take it by name)
from helpers.simnode import wait_for
from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.errors import GpuwardenError
from helpers.paths import REPO


def one_line(proc: subprocess.CompletedProcess, needle: str, code: int = 2) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[0].startswith("gpuwarden: error: ") and needle in lines[0], proc.stderr
    assert len(lines) <= 2 and "Traceback" not in proc.stderr, proc.stderr


def with_member(raw: bytes, rel: str, data: bytes) -> bytes:
    """The bundle with member top/`rel` replaced by `data`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as src, \
            tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            body = src.extractfile(m).read() if m.isfile() else None
            if m.name.split("/", 1)[-1] == rel:
                body, m.size = data, len(data)
            dst.addfile(m, io.BytesIO(body) if body is not None else None)
    return out.getvalue()


# --- gzip cut short, corrupt --------------------------------------------------------------------

@pytest.mark.parametrize("command", [("triage",), ("status", "--bundle")])
def test_a_ten_byte_gzip_is_named_truncated_not_aborted(tmp_path, command):
    path = tmp_path / "b.tar.gz"
    path.write_bytes(gzip.compress(b"x" * 1000)[:10])  # the gzip header and nothing else
    proc = gpuwarden("--state-dir", str(tmp_path / "s"), *command, str(path), timeout=60)
    one_line(proc, f"{path} is a truncated gzip file")
    assert "aborted" not in proc.stderr


def test_a_bundle_cut_in_its_gzip_stream_and_a_corrupt_one(tmp_path, real_bundle):
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(real_bundle[:len(real_bundle) * 2 // 3])
    one_line(gpuwarden("triage", str(cut), timeout=60), f"the bundle {cut} is truncated")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(real_bundle[:20] + bytes(b ^ 0x5A for b in real_bundle[20:200]) + real_bundle[200:])
    proc = gpuwarden("triage", str(bad), timeout=60)
    one_line(proc, "corrupt gzip")
    assert str(bad) in proc.stderr


# --- JSON nested past the limit -----------------------------------------------------------------

def test_the_nesting_limit_is_exact_and_strings_do_not_count():
    assert jsondoc.loads(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(jsondoc.TooDeep, match="more than 64 levels"):
        jsondoc.loads(b"[" * 65 + b"]" * 65)
    text = json.dumps({"a": "[[[[{{{{" * 100, "b": ["\\\"[", {"c": "]\\\\"}]})
    assert jsondoc.loads(text) == json.loads(text) and jsondoc.nesting(text.encode()) == 3
    with pytest.raises(ValueError):
        jsondoc.loads(b"[[1]")  # unbalanced: the parser's own error
    with pytest.raises(jsondoc.TooDeep):
        jsondoc.loads(b"[" * (1 << 20))  # never closed: refused, not a RecursionError


@pytest.mark.parametrize("command", [("triage",), ("status", "--bundle")])
def test_a_snapshot_nested_100000_deep_is_one_line(tmp_path, real_bundle, command):
    path = tmp_path / "deep.tar.gz"
    path.write_bytes(with_member(real_bundle, "gpuwarden/snapshot.json", b"[" * 100_000 + b"]" * 100_000))
    proc = gpuwarden("--state-dir", str(tmp_path / "s"), *command, str(path), timeout=60)
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr + proc.stdout, proc.stderr
    if command == ("triage",):  # the rest of the bundle is still triaged; the snapshot is said to be unreadable
        assert proc.returncode in (0, 1), proc.stderr
        assert "gpuwarden/snapshot.json is unreadable (nested more than 64 levels deep" in proc.stdout, proc.stdout
    else:
        one_line(proc, "snapshot.json is refused: nested more than 64 levels deep")


def test_report_refuses_a_deep_member_in_one_line(tmp_path, real_bundle):
    from gpuwarden.ops.bugreport.build import build
    path = tmp_path / "deep.tar.gz"
    path.write_bytes(with_member(real_bundle, "gpuwarden/arenas.json", b"{\"a\":" * 5000 + b"1" + b"}" * 5000))
    with pytest.raises(GpuwardenError, match="arenas.json is unreadable \\(nested more than 64"):
        build(path)


# The manifest is judged by the one bundle reader (replay.open_bundle, issue 39 item 3), in its words.
@pytest.mark.parametrize("rel,data,expected", [
    ("gpuwarden/snapshot.json", b"[1]", "gpuwarden/snapshot.json is unreadable \\(not a JSON object\\)"),
    ("manifest.json", b"\"items\"", "manifest.json is not a JSON object"),
    ("gpuwarden/arenas.json", b"5", "gpuwarden/arenas.json is unreadable \\(not a JSON array\\)")])
def test_report_refuses_a_member_of_the_wrong_shape_in_one_line(tmp_path, real_bundle, rel, data, expected):
    from gpuwarden.ops.bugreport.build import build
    path = tmp_path / "shape.tar.gz"
    path.write_bytes(with_member(real_bundle, rel, data))
    with pytest.raises(GpuwardenError, match=expected):
        build(path)


def test_report_reads_past_versions_of_the_wrong_shape(tmp_path, real_bundle):
    """node/versions.json only feeds the environment section: of another shape it is left out, not fatal."""
    from gpuwarden.ops.bugreport.build import build
    path = tmp_path / "versions.tar.gz"
    path.write_bytes(with_member(real_bundle, "node/versions.json", b"[1]"))
    env = build(path)["environment"]
    assert env["kernel"] is None and env["gpuwarden"] is None and len(env["gpus"]) == 2, env


# --- absurd member sizes, a decompression bomb ----------------------------------------------------

def _member_claiming(raw: bytes, size: int) -> bytes:
    """The bundle with one more member whose ustar header claims `size` bytes it does not hold."""
    body = bytearray(gzip.decompress(raw))
    with tarfile.open(fileobj=io.BytesIO(bytes(body))) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        end = tar.offset  # where the zero blocks that end the archive begin (the record's padding follows)
    block = bytearray(tarfile.TarInfo(top + "/huge.bin").tobuf(format=tarfile.USTAR_FORMAT))
    block[124:136] = f"{size:011o}".encode() + b"\0" if size < 8 ** 11 else b"\x80" + size.to_bytes(11, "big")
    block[148:156] = b"        "
    block[148:156] = f"{sum(block):06o}\0 ".encode()
    body[end:end] = bytes(block)
    return gzip.compress(bytes(body))


@pytest.mark.parametrize("size, needle", [(2 ** 80, "has a member of"), (900 << 20, "is truncated")])
def test_a_member_claiming_a_huge_size_is_refused_unread(tmp_path, real_bundle, size, needle):
    path = tmp_path / "huge.tar.gz"
    path.write_bytes(_member_claiming(real_bundle, size))
    t0 = time.monotonic()
    for command in (("triage",), ("status", "--bundle")):
        one_line(gpuwarden("--state-dir", str(tmp_path / "s"), *command, str(path), timeout=60), needle)
    assert time.monotonic() - t0 < 50


def test_a_gzip_bomb_stops_at_the_stated_unpacked_cap(tmp_path, monkeypatch):
    """The same walk as at the real 2 GiB cap, at 8 MiB: members of zeros that compress 1000:1."""
    from gpuwarden.ops.bundle import replay
    monkeypatch.setattr(replay, "MAX_TOTAL_BYTES", 8 << 20)
    path = tmp_path / "bomb.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for i in range(4):
            info = tarfile.TarInfo(f"top/zeros{i}")
            info.size = 4 << 20
            tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert path.stat().st_size < 100_000
    with pytest.raises(GpuwardenError, match=r"unpacks to more than 8\.0 MiB \(the most gpuwarden reads") as exc:
        replay.open_bundle(path)
    assert "decompression bomb" in (exc.value.hint or "")
    assert replay.MAX_MEMBER_BYTES == 1 << 30  # the stated caps (README, CHANGELOG)
    monkeypatch.undo()
    assert replay.MAX_TOTAL_BYTES == 2 << 30


# --- a log still being written ------------------------------------------------------------------

LOG_LINE = b"[  100.000000] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n"


def test_triage_reads_a_growing_log_to_its_size_at_the_start(tmp_path, monkeypatch):
    """The writer appends while triage reads (at its first chunk, deterministically): the report covers the
    bytes that were there and says how much came after."""
    from gpuwarden.ops.triage import stream
    from gpuwarden.playbooks.cli.commands import triage
    log = tmp_path / "kern.log"
    log.write_bytes(LOG_LINE * 2000)
    start = log.stat().st_size
    push = stream.StreamFeeder.push
    wrote = []

    def push_and_grow(self, chunk):
        if not wrote:
            with open(log, "ab") as f:
                f.write(LOG_LINE * 500)
            wrote.append(True)
        return push(self, chunk)
    monkeypatch.setattr(stream.StreamFeeder, "push", push_and_grow)
    report = triage._read_report(str(log))
    assert wrote and report.lines == 2000, report.lines
    grew = [n for n in report.notes if "grew by" in n]
    assert len(grew) == 1 and "as it was when triage started" in grew[0], report.notes
    assert log.stat().st_size > start


def test_triage_of_a_log_a_writer_keeps_writing_ends(tmp_path):
    """A real writer that starts once triage has the log open and writes as fast as it can (the bug: triage
    followed it for as long as it wrote): the report has exactly the lines that were there at the start."""
    log = tmp_path / "kern.log"
    lines = 125_000  # 8 MB: long enough a read that the writer gets going under it
    log.write_bytes(LOG_LINE * lines)
    writer = subprocess.Popen([sys.executable, "-c", f"""
import os, sys
fd = os.open({str(log)!r}, os.O_WRONLY | os.O_APPEND)
block = {LOG_LINE * 1000!r}
sys.stdin.readline()
for _ in range((64 << 20) // len(block)):  # bounded: 64 MiB more at most
    os.write(fd, block)
sys.stdin.readline()
"""], stdin=subprocess.PIPE, text=True)
    triage = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", "triage", "--json", str(log)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        def has_it_open() -> bool:
            try:
                return any(os.readlink(f"/proc/{triage.pid}/fd/{fd}") == str(log)
                           for fd in os.listdir(f"/proc/{triage.pid}/fd"))
            except OSError:
                return triage.poll() is not None
        wait_for(has_it_open, timeout=60, poll=0.005, what="triage opening the log")
        writer.stdin.write("go\n")
        writer.stdin.flush()
        out, err = triage.communicate(timeout=60)
        assert triage.returncode in (0, 1), err
        assert json.loads(out)["lines"] == lines  # not one line of what the writer added
    finally:
        triage.kill()
        writer.kill()
        writer.wait()
        triage.wait()
