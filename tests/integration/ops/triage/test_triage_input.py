"""`gpuwarden triage` on hostile and odd input, through the real CLI: FIFOs, devices, pipes, empty and binary
files, terminal escapes in a log, and the --explain / --json contracts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


from helpers.paths import REPO

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.triage import explain

CORPUS = REPO / "tests" / "triage_corpus"
ONE = CORPUS / "c01_amdgpu202_gfx12_ring_timeout_new_process_wording.log"


def _run(args: list[str], stdin=None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "triage", *args], cwd=REPO, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout)


def _one_line_error(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("gpuwarden: error: ") and words in proc.stderr.splitlines()[0], proc.stderr


def test_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    _one_line_error(_run([str(fifo)], timeout=20), "is a FIFO")


def test_devices_are_refused_as_path_and_as_stdin():
    _one_line_error(_run(["/dev/zero"]), "is a character device")
    with open("/dev/zero", "rb") as zero:
        _one_line_error(_run(["-"], stdin=zero, timeout=20), "standard input is a character device")


def test_stdin_pipe_is_streamed_and_judged_like_the_file(tmp_path):
    with open(ONE, "rb") as f:
        piped = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "triage", "-"], cwd=REPO, stdin=f,
                               capture_output=True, text=True, timeout=30)
    direct = _run([str(ONE)])
    assert piped.returncode == direct.returncode == 1
    assert piped.stdout.splitlines()[0] == direct.stdout.splitlines()[0]
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\nthis is not a log\n")
    with open(garbage, "rb") as f:
        from_pipe = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "triage", "-"], cwd=REPO, stdin=f,
                                   capture_output=True, text=True, timeout=30)
    _one_line_error(from_pipe, "does not look like a kernel log")
    _one_line_error(_run([str(garbage)]), "does not look like a kernel log")


def test_empty_and_binary_files_are_errors(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    _one_line_error(_run([str(empty)]), "is empty")
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    _one_line_error(_run([str(binary)]), "binary data")
    _one_line_error(_run([str(tmp_path)]), "is a directory")


def test_terminal_escapes_in_a_log_are_printed_as_text(tmp_path):
    log = tmp_path / "evil.log"
    evil = "a.out\x1b]0;pwned\x07\x1b[2J"
    log.write_text(f"[  867.972499] {evil}[3017]: segfault at 18 ip 00007782ccbca89d sp 00007ffd5ab1e0f0 error 4 "
                   f"in libamdhip64.so.6[3ca89d,7782cc824000+430000] likely on CPU 10 (core 2, socket 0)\n"
                   f"[  868.0] amdgpu 0000:03:00.0: amdgpu: GPU reset begin! \x1b[31mred\x1b[0m\n")
    proc = _run([str(log)])
    assert proc.returncode == 1
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b]0;pwned\\x07" in proc.stdout
    doc = json.loads(_run([str(log), "--json"]).stdout)
    assert "\x1b" not in json.dumps(doc, ensure_ascii=False)


def test_secrets_quoted_from_a_log_are_redacted(tmp_path):
    log = tmp_path / "engine.log"
    token = "hf_" + "Q" * 30
    log.write_text(f"RuntimeError: HIP error: invalid argument while loading with HF_TOKEN={token}\n")
    for args in ([str(log)], [str(log), "--json"]):
        proc = _run(args)
        assert proc.returncode == 1 and "HIP runtime error" in proc.stdout
        assert token not in proc.stdout and "REDACTED" in proc.stdout


def test_json_document_validates_against_its_schema():
    proc = _run([str(CORPUS / "c29_akash244_ctime_xid43_xid31_then_xid94_ecc.log"), "--json"])
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert doc["schema"] == "gpuwarden.triage/1" and doc["exit_code"] == 1
    assert doc["findings"][0]["details"]["xid"] == 94  # the ECC Xid before the application Xids
    assert doc["findings"][0]["first_time_iso"].startswith("2024-08-09T")


def test_explain_has_meaning_and_first_check_for_every_rule():
    ids = [e.id for e in explain.entries()]
    assert len(ids) == len(set(ids))
    for e in explain.entries():
        assert e.meaning.strip() and e.check.strip(), e.id
    proc = _run(["--explain", "kfd.userptr"])
    assert proc.returncode == 0
    assert "What it means:" in proc.stdout and "First thing to check:" in proc.stdout
    assert "no_system_mem_limit" in proc.stdout
    assert "GPU has fallen off the bus" in explain.text(explain.lookup("xid79"))
    assert "kfd.userptr" in explain.listing()
    bad = _run(["--explain", "ring_timeout"])
    _one_line_error(bad, "no triage rule is called")
    assert "amdgpu.ring_timeout" in bad.stderr
