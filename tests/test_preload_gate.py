"""The flock gate driven from C (the interposer inside an engine) and from Python (gpuwarden.ops.gate) at once.

A SIGKILL inside the register call frees the slot; a hung call is reported and lets the others go on;
gate_release holds the slot past the call until ready or for N seconds.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from engines.preload_harness import Engine, calls, engine_argv, events, phases, preload_env, standin_env
from gpuwarden.ops import gate
from simnode import wait_for


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
