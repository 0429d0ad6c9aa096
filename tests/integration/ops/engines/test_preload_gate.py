"""The flock gate driven from C (the interposer inside an engine) and from Python (gpuwarden.ops.foundation.gate) at once.

A SIGKILL inside the register call frees the slot; a hung call is reported and lets the others go on;
gate_release holds the slot past the call until ready or for N seconds.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from engines.preload_harness import Engine, calls, engine_argv, events, phases, preload_env, standin_env
from gpuwarden.ops.foundation import gate
from helpers.simnode import wait_for


def _event(work, phase, pid=None):
    return next((e for e in events(work, pid) if e.phase == phase), None)


def test_a_python_holder_makes_the_interposer_wait(standins, tmp_path):
    slot = gate.acquire(tmp_path / "gate", 1, who="python")
    engine = Engine(engine_argv(standins, "linked"), {**standin_env(tmp_path), **preload_env(tmp_path)}, tmp_path)
    try:
        wait_for(lambda: _event(tmp_path, "waiting"), 20, "the interposer to wait at the gate")
        assert "registering" not in phases(tmp_path) and calls(tmp_path / "standin") == []
        assert [h["who"] for h in gate.holders(tmp_path / "gate", 1)] == ["python"]
        released = time.time()
        slot.release()
        engine.wait_output("serving")
        registering = _event(tmp_path, "registering")
        assert registering.ts >= released and registering.data["wait_s"] > 0
        assert calls(tmp_path / "standin")[0]["start"] >= released
    finally:
        slot.release()
        engine.stop()


def test_sigkill_inside_the_register_call_frees_the_slot(standins, tmp_path):
    env = {**standin_env(tmp_path, register_ms=60_000), **preload_env(tmp_path)}
    engine = Engine(engine_argv(standins, "dlopen"), env, tmp_path)
    try:
        wait_for(lambda: _event(tmp_path, "registering"), 20, "the engine inside its register call")
        # Python sees the C holder, as `engines list` and the shim do, and cannot get in.
        held = gate.holders(tmp_path / "gate", 1)
        assert [(h["pid"], h["who"]) for h in held] == [(engine.proc.pid, "preload:test")]
        with pytest.raises(gate.GateTimeout):
            gate.acquire(tmp_path / "gate", 1, timeout_s=0.2)
        os.kill(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait(10)
        # The kernel dropped the flock with the process: the slot is free at once.
        slot = gate.acquire(tmp_path / "gate", 1, who="next", timeout_s=5)
        slot.release()
        assert "registered" not in phases(tmp_path)
    finally:
        engine.kill()


def test_a_hung_call_is_reported_and_its_slot_let_go(standins, tmp_path):
    env = {**standin_env(tmp_path, register_ms=2500), **preload_env(tmp_path, GPUWARDEN_REGISTRATION_TIMEOUT="0.3")}
    engine = Engine(engine_argv(standins, "linked"), env, tmp_path)
    try:
        wait_for(lambda: _event(tmp_path, "register-hung"), 20, "the hung call to be reported")
        hung = _event(tmp_path, "register-hung")
        assert hung.data["call"] == "hipHostRegister" and hung.data["seconds"] >= 0.3
        # The others go on while the call is still running.
        slot = gate.acquire(tmp_path / "gate", 1, who="other", timeout_s=5)
        slot.release()
        assert calls(tmp_path / "standin") == [], "the call was still running"
        engine.wait_output("serving")
        registered = _event(tmp_path, "registered")
        assert registered.data.get("late") is True
        assert _event(tmp_path, "gate-released").data["reason"] == "hung"
    finally:
        engine.stop()


def test_release_ready_holds_the_slot_until_the_ready_file(standins, tmp_path):
    ready = tmp_path / "gate-ready"
    env = {**standin_env(tmp_path), **preload_env(tmp_path, GPUWARDEN_GATE_RELEASE="ready",
                                                   GPUWARDEN_GATE_READY_FILE=str(ready))}
    engine = Engine(engine_argv(standins, "ctypes"), env, tmp_path)
    try:
        engine.wait_output("serving")
        assert _event(tmp_path, "registered") is not None
        assert [h["pid"] for h in gate.holders(tmp_path / "gate", 1)] == [engine.proc.pid]
        with pytest.raises(gate.GateTimeout):
            gate.acquire(tmp_path / "gate", 1, timeout_s=0.2)
        ready.touch()
        wait_for(lambda: _event(tmp_path, "gate-released"), 10, "the slot to be released once ready")
        assert _event(tmp_path, "gate-released").data["reason"] == "ready"
        gate.acquire(tmp_path / "gate", 1, timeout_s=2).release()
    finally:
        engine.stop()


def test_release_after_n_seconds(standins, tmp_path):
    env = {**standin_env(tmp_path), **preload_env(tmp_path, GPUWARDEN_GATE_RELEASE="0.4s")}
    engine = Engine(engine_argv(standins, "linked"), env, tmp_path)
    try:
        wait_for(lambda: _event(tmp_path, "gate-released"), 20, "the slot to be released")
        registered, released = _event(tmp_path, "registered"), _event(tmp_path, "gate-released")
        assert released.data["reason"] == "after"
        assert released.ts - registered.ts >= 0.4 - 0.01
        assert released.data["held_s"] >= registered.data["seconds"] + 0.4 - 0.01
    finally:
        engine.stop()


def test_a_broken_gate_never_stops_the_engine(standins, tmp_path):
    # A gate directory that cannot exist: the call goes ahead ungated and the events say so.
    env = {**standin_env(tmp_path), **preload_env(tmp_path), "GPUWARDEN_GATE_DIR": "/proc/self/no/gate"}
    engine = Engine(engine_argv(standins, "linked"), env, tmp_path)
    try:
        engine.wait_output("serving")
        assert "gate" in _event(tmp_path, "preload-warning").data["message"]
        assert _event(tmp_path, "registered").data["slot"] is None
    finally:
        engine.stop()


WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}


@pytest.mark.parametrize("result", ["0", "2"])
def test_the_result_line_is_written_while_the_slot_is_still_held(result, standins, tmp_path):
    # The engine writes its status lines into a pipe the test fills up once the call is under way, so the result
    # line's write() blocks: while it blocks, the slot must still be held. Released before the line (the old
    # order), another engine's "registering" could be written before this one's "registered" under a 1-slot
    # gate: windows that never overlapped would look as if they did.
    machine = os.uname().machine
    if machine not in WRITE_SYSCALL:
        pytest.skip(f"no write() syscall number known for {machine}")
    read_end, write_end = os.pipe()
    env = {**standin_env(tmp_path, register_ms=1500, fault_at=0),
           **{k: v for k, v in preload_env(tmp_path).items() if k != "GPUWARDEN_STATUS_FILE"},
           "GPUWARDEN_STATUS_FD": str(write_end), "STANDIN_RESULT": result}
    import subprocess
    proc = subprocess.Popen(engine_argv(standins, "linked"), env={**os.environ, **env}, pass_fds=(write_end,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write_end)
    filler = os.open(f"/proc/{proc.pid}/fd/{write_end}", os.O_WRONLY | os.O_NONBLOCK)  # its own O_NONBLOCK
    try:
        got = _Reader(read_end)
        wait_for(lambda: b'"registering"' in got.more(), 20, "the registering line")
        # The call sleeps 1.5 s inside the stand-in: fill the pipe to the last byte now.
        try:
            while True:
                os.write(filler, b"\n")
        except BlockingIOError:
            pass
        assert calls(tmp_path / "standin") == [], "the register call ended before the pipe was full"

        def blocked_in_write() -> bool:
            fields = open(f"/proc/{proc.pid}/syscall").read().split()
            return bool(fields) and fields[0] == str(WRITE_SYSCALL[machine])
        wait_for(blocked_in_write, 20, "the engine to block writing its result line")
        assert len(calls(tmp_path / "standin")) == 1  # the call is over: this write is its result line
        with pytest.raises(gate.GateTimeout):
            gate.acquire(tmp_path / "gate", 1, timeout_s=0.2)
        want = b'"phase":"registered"' if result == "0" else b'"phase":"register-failed"'
        wait_for(lambda: want in got.more(), 20, "the result line")
        gate.acquire(tmp_path / "gate", 1, timeout_s=5).release()  # and then it went
    finally:
        os.close(filler)
        proc.kill()
        proc.wait(10)
        os.close(read_end)


class _Reader:
    """What a pipe has given so far, complete lines only (filler lines are empty)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.data = b""

    def more(self) -> bytes:
        import select
        while select.select([self.fd], [], [], 0.05)[0]:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                break
            self.data += chunk
        return self.data[:self.data.rfind(b"\n") + 1]
