"""Helpers for the interposer tests: the built stand-ins, unmodified engines run under the preload, what they said.

An engine here registers SIZE bytes with a stand-in runtime whose register call sleeps STANDIN_REGISTER_MS and
faults when STANDIN_FAULT_AT calls overlap; calls.log in the stand-in's directory lists every call it served.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.ops.engines import preload
from gpuwarden.ops.foundation.status_protocol import StatusEvent, read_events
from helpers.simnode import wait_for
from standins.preload_build import CTYPES_ENGINE, build

SIZE = 512 << 20  # above the default 256 MiB threshold
C_MODES = ("linked", "dlopen", "hipproc", "cuproc", "cudart", "deepbind", "deepdlsym")


def build_standins(out: Path) -> Path:
    """What conftest's session fixture `standins` builds once: the stand-ins and engines, beside the interposer."""
    if not preload.LIBRARY.is_file():
        pytest.fail(f"{preload.LIBRARY} is not built: run `pip install -e .` (it needs a C compiler)")
    return build(out)


def engine_argv(standins: Path, mode: str, size: int = SIZE) -> list[str]:
    """The command line of an unmodified engine reaching the register call its way (C_MODES, ctypes, torchlike)."""
    if mode in ("ctypes", "torchlike"):
        return [sys.executable, str(CTYPES_ENGINE), str(size), str(standins), "hip" if mode == "ctypes" else mode]
    program = "engine_linked" if mode == "linked" else "engine_dlopen"
    return [str(standins / program), str(size), mode]


def standin_env(work: Path, register_ms: int = 100, fault_at: int = 3) -> dict[str, str]:
    (work / "standin").mkdir(parents=True, exist_ok=True)
    return {"STANDIN_DIR": str(work / "standin"), "STANDIN_REGISTER_MS": str(register_ms),
            "STANDIN_FAULT_AT": str(fault_at)}


def preload_env(work: Path, *, gate: bool = True, slots: int = 1, **extra: str) -> dict[str, str]:
    """What the shim would set: LD_PRELOAD, the status file, the gate (unless gate=False), and `extra`."""
    env = {"LD_PRELOAD": str(preload.LIBRARY), "GPUWARDEN_STATUS_FILE": str(work / "status.jsonl"),
           "GPUWARDEN_ENGINE": "test"}
    if gate:
        env.update({"GPUWARDEN_GATE_DIR": str(work / "gate"), "GPUWARDEN_GATE_SLOTS": str(slots)})
    env.update(extra)
    return env


class Engine:
    """One engine process; stdout goes to a file so that a test can wait for a line."""

    def __init__(self, argv: list[str], env: dict[str, str], work: Path, name: str = "engine"):
        self.out = work / f"{name}.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    @property
    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 20) -> None:
        wait_for(lambda: text in self.output or self.proc.poll() is not None, timeout, f"{text!r} from the engine")
        assert text in self.output, self.output

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def events(work: Path, pid: int | None = None) -> list[StatusEvent]:
    """The interposer's status events (optionally of one pid), in file order."""
    return [e for e in read_events(work / "status.jsonl")
            if e.data.get("source") == "preload" and (pid is None or e.data.get("pid") == pid)]


def phases(work: Path, pid: int | None = None) -> list[str]:
    return [e.phase for e in events(work, pid) if e.phase != "preloaded"]


def calls(standin_dir: Path) -> list[dict]:
    """The stand-in's own record of every register call it served: pid, call, start, end, bytes, most inside."""
    try:
        lines = (standin_dir / "calls.log").read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if parts[0] == "call":
            out.append({"pid": int(parts[1]), "call": parts[2], "start": float(parts[3]), "end": float(parts[4]),
                        "bytes": int(parts[5]), "most": int(parts[6])})
    return out
