"""Helpers for tests on the simulated node: start tenants as real processes, wait for them.

A tenant is `gpuwarden sim hold`; a "careless parent" spawns one and never reaps it.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.paths import REPO


def cli_argv(state_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "--backend", "sim", *args]


def start_tenant(state_dir: Path, gpu: int, size: str, env: dict | None = None) -> subprocess.Popen:
    """A real process holding `size` of VRAM on simulated GPU `gpu`; returns once it holds it."""
    proc = subprocess.Popen(cli_argv(state_dir, "sim", "hold", "--gpu", str(gpu), "--size", size),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    if not line.startswith("holding"):
        proc.kill()
        raise AssertionError(f"tenant did not start: {line!r} {proc.stderr.read()}")
    return proc


CARELESS_PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
line = child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)   # never waits for the child: a SIGKILLed child stays a zombie
"""


def start_careless_parent(state_dir: Path, gpu: int, size: str) -> tuple[subprocess.Popen, int]:
    """A parent that never reaps its tenant child; returns (parent, child pid) once the child holds VRAM."""
    parent = subprocess.Popen([sys.executable, "-c", CARELESS_PARENT,
                               *cli_argv(state_dir, "sim", "hold", "--gpu", str(gpu), "--size", size)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    child = int(parent.stdout.readline())
    return parent, child


def wait_for(predicate, timeout: float = 10.0, what: str = "condition", poll: float = 0.03):
    """The predicate's first truthy value, polled until the deadline; AssertionError naming `what` after it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def proc_state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2]


def ignores(pid: int, sig: int) -> bool:
    """True once process `pid` ignores signal `sig` (its SigIgn mask in /proc/<pid>/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def kill_and_wait_zombie(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: proc_state(pid) == "Z", what=f"pid {pid} to become a zombie")


def on_terminal(argv: list[str], answer: bytes, timeout: float = 30.0) -> tuple[int, str]:
    """Run argv with stdin/stdout on a pseudo-terminal; answer the first prompt; return (rc, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out, answered = b"", False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if not answered and b"Proceed?" in out:
                os.write(master, answer)
                answered = True
        elif proc.poll() is not None:
            break
    rc = proc.wait(timeout=10)
    os.close(master)
    return rc, out.decode(errors="replace")
