"""Fleet inventories that are not inventories (issue 25 item 7): a FIFO with and without a writer, /dev/zero, a
directory, ranges of a billion hosts (the Ansible reader's
are tested in-process in test_fleet_inventory.py). Each is the real CLI in a child process under a deadline: exit 2, one error
line, no traceback, a few tens of MiB at most (the child's own peak RSS, from wait4).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

DEADLINE_S = 30.0  # a hang or a runaway expansion is stopped here; the answer takes a CLI start (~1-2 s)
MAX_RSS_KIB = 150 * 1024  # the CLI itself is ~40 MiB; a hundred million names would be gigabytes


def _vm_hwm_kib(pid: int) -> int:
    """The peak resident size of a running process's memory (VmHWM, KiB), 0 when it has gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _run_all(cases: dict[str, list[str]], cwd: Path) -> dict[str, tuple[int, str, int, float]]:
    """Every case at once (2 cores: side by side costs about one start, not six); (exit, stderr, peak KiB, seconds)."""
    started = time.monotonic()
    procs = {}
    for name, args in cases.items():
        err = open(cwd / f"{name}.err", "w+")
        procs[name] = (subprocess.Popen([sys.executable, "-m", "gpuwarden", "fleet", *args], cwd=cwd,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err), err)
    out = {}
    hwm: dict[str, int] = {}
    try:
        while len(out) < len(procs):  # every child looked at on each round: they run side by side
            for name, (proc, err) in procs.items():
                if name in out:
                    continue
                seen = _vm_hwm_kib(proc.pid)
                if seen:
                    hwm[name] = max(hwm.get(name, 0), seen)
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if not pid:
                    continue
                proc.returncode = os.waitstatus_to_exitcode(status)
                err.seek(0)
                # wait4's ru_maxrss counts the memory of the process the child was forked from until its exec
                # (the kernel keeps the larger of the two): under a long-running pytest-xdist worker that is the
                # worker's hundreds of MiB. The child's own high-water mark, read while it runs, is the figure;
                # ru_maxrss only where a child ended before its first look.
                out[name] = (proc.returncode, err.read(), hwm.get(name, usage.ru_maxrss), time.monotonic() - started)
            if len(out) < len(procs):
                if time.monotonic() - started > DEADLINE_S:
                    late = sorted(set(procs) - set(out))
                    raise AssertionError(f"{late}: still running after {DEADLINE_S:g}s (a hang or an unbounded read)")
                time.sleep(0.05)
    finally:
        for proc, err in procs.values():
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            err.close()
    return out


def test_special_files_and_huge_ranges_are_one_line_fast_in_bounded_memory(tmp_path):
    silent, fed = tmp_path / "silent.fifo", tmp_path / "fed.fifo"
    os.mkfifo(silent)
    os.mkfifo(fed)
    held = os.open(silent, os.O_RDWR | os.O_NONBLOCK)  # a writer that never writes: a plain read waits for ever
    # A writer pouring names in, as `yes` into a pipe would: a plain read never reaches the end.
    writer = subprocess.Popen(["sh", "-c", f"exec yes gpu01 > {fed}"], stderr=subprocess.DEVNULL)
    (tmp_path / "huge.hosts").write_text("# one line, a hundred million hosts\ngpu[1-99999999]\n")
    cases = {
        "fifo": ["status", "--hosts", str(silent), "--json"],
        "fifo-writer": ["status", "--hosts", str(fed), "--json"],
        "zero": ["status", "--hosts", "/dev/zero", "--json"],
        "directory": ["status", "--hosts", str(tmp_path)],
        "range": ["status", "--hosts", str(tmp_path / "huge.hosts")],
        "nodelist": ["status", "--nodelist", "n[1-1000]x[1-1000]y[1-1000]", "--json"],
    }
    expected = {
        "fifo": f"hosts file {silent} is a FIFO (named pipe), not a regular file",
        "fifo-writer": f"hosts file {fed} is a FIFO (named pipe), not a regular file",
        "zero": "hosts file /dev/zero is a character device, not a regular file",
        "directory": f"hosts file {tmp_path} is a directory, not a regular file",
        "range": f"{tmp_path / 'huge.hosts'}:2: 'gpu[1-99999999]' names 99,999,999 hosts, more than the 5,000",
        "nodelist": "--nodelist 'n[1-1000]x[1-1000]y[1-1000]' names 1,000,000,000 hosts, more than the 5,000",
    }
    try:
        results = _run_all(cases, tmp_path)
    finally:
        os.close(held)
        writer.kill()
        writer.wait()
    for name, (code, stderr, peak_kib, _seconds) in results.items():
        lines = stderr.strip().splitlines()
        assert code == 2, (name, code, stderr)
        assert lines and lines[0].startswith(f"gpuwarden: error: {expected[name]}"), (name, stderr)
        assert len(lines) == 2 and lines[1].startswith("  hint: ") and "Traceback" not in stderr, (name, stderr)
        assert peak_kib < MAX_RSS_KIB, (name, f"peak RSS {peak_kib} KiB")
    hint = results["range"][1].splitlines()[1]
    assert "at most 5,000 hosts" in hint and "split the fleet" in hint
    assert "a pipe, a device or a directory is never read" in results["zero"][1]


def test_help_states_the_caps():
    import re
    proc = subprocess.run([sys.executable, "-m", "gpuwarden", "fleet", "status", "--help"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    text = re.sub(r"\s+", " ", proc.stdout)
    assert "at most 5,000 hosts in all" in text and "counted before they are expanded" in text, text
    assert "regular file of at most 4 MiB" in text, text
