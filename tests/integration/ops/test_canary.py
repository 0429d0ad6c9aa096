"""The canary engine as a real child process: phases through the status protocol, SIGTERM, fault switches.

Runtimes host (mlock, really pins) and sim (records in the sim node); hip/cuda must fail in one line here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

from gpuwarden.ops.foundation.status_protocol import read_events
from helpers.canary import make_arena, spawn, wait_phase


def vm_locked(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1]) * 1024
    return 0


def test_host_canary_pins_serves_and_stops_on_sigterm(tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena")
    status = tmp_path / "c.status"
    proc = spawn(arena, status, state_dir, "--runtime", "host", "--gpu", "0")
    try:
        events = wait_phase(status, "serving", proc)
        assert vm_locked(proc.pid) >= 4 << 20, "host runtime did not pin the arena"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        proc.kill()
    events = read_events(status)
    phases = [e.phase for e in events]
    assert phases == ["starting", "mapping", "verifying", "registering", "registered", "serving", "stopping", "exited"]
    reg = next(e for e in events if e.phase == "registered")
    assert reg.data["bytes"] == 4 << 20 and reg.data["seconds"] >= 0 and reg.data["pid"] == proc.pid
    serving = next(e for e in events if e.phase == "serving")
    assert serving.data["gbps"] > 0
    out = proc.stdout.read()
    assert "session is up" in out and "stopped cleanly" in out


def test_crash_at_phase_dies_by_that_signal(tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena")
    status = tmp_path / "c.status"
    proc = spawn(arena, status, state_dir, "--runtime", "sim", "--gpu", "1", "--crash-at", "registered",
                 "--crash-signal", "SEGV")
    assert proc.wait(20) == -signal.SIGSEGV
    phases = [e.phase for e in read_events(status)]
    assert phases[-1] == "registered"
    from gpuwarden.ops.node.sim import registrations
    recs = registrations.list_all(state_dir)
    # The crash skipped the unregister: the sim node keeps the registration, now owned by a dead process.
    assert len(recs) == 1 and recs[0]["stale"] and recs[0]["gpu"] == 1 and recs[0]["bytes"] == 4 << 20


def test_hang_at_phase_ignores_sigterm(tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena")
    status = tmp_path / "c.status"
    proc = spawn(arena, status, state_dir, "--runtime", "host", "--hang-at", "registering")
    try:
        wait_phase(status, "registering", proc)  # announced once SIGTERM is ignored
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(1.0)
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
    assert [e.phase for e in read_events(status)][-1] == "registering"


def test_truncated_arena_is_refused_by_the_canary(tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena")
    os.truncate(arena, arena.stat().st_size - 4096)
    status = tmp_path / "c.status"
    proc = spawn(arena, status, state_dir, "--runtime", "host")
    assert proc.wait(20) == 1
    err = proc.stderr.read()
    assert "Traceback" not in err and "is truncated" in err.splitlines()[0]
    last = read_events(status)[-1]
    assert last.phase == "exited" and "truncated" in last.data["error"]


@pytest.mark.parametrize("runtime,needle", [("hip", "hip"), ("cuda", "cuda")])
def test_gpu_runtime_without_library_is_one_line(cli, tmp_path, runtime, needle):
    arena = make_arena(tmp_path / "a.arena")
    proc = cli("canary", "--arena", str(arena), "--runtime", runtime)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"gpuwarden: error: {needle}")


def test_memlock_too_low_reports_the_numbers(tmp_path, state_dir):
    import shutil
    if not shutil.which("prlimit") or (os.geteuid() == 0 and not shutil.which("setpriv")):
        pytest.skip("needs prlimit and, as root, setpriv (util-linux)")
    arena = make_arena(tmp_path / "a.arena")
    argv = [sys.executable, "-m", "gpuwarden.ops.canary", "--arena", str(arena), "--runtime", "host", "--verify", "none"]
    if os.geteuid() == 0:  # root has CAP_IPC_LOCK, which ignores the limit: drop it
        argv = ["setpriv", "--inh-caps=-all", "--bounding-set=-ipc_lock", "--", *argv]
    proc = subprocess.run(["prlimit", "--memlock=65536:65536", "--", *argv], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "GPUWARDEN_STATE_DIR": str(state_dir)}, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "RLIMIT_MEMLOCK is 64.0 KiB (65536 bytes)" in proc.stderr and "4.0 MiB" in proc.stderr
    assert "ulimit -l" in proc.stderr


def test_chunked_registration_and_sim_visibility(tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena")
    status = tmp_path / "c.status"
    proc = spawn(arena, status, state_dir, "--runtime", "sim", "--gpu", "0", "--register-chunk", "1MiB",
                 env={"CUDA_VISIBLE_DEVICES": "3", "ROCR_VISIBLE_DEVICES": "3"})
    try:
        events = wait_phase(status, "serving", proc)
        assert next(e for e in events if e.phase == "registered").data["chunks"] == 4
        from gpuwarden.ops.node.sim import registrations
        recs = registrations.list_all(state_dir)
        assert len(recs) == 4 and {r["gpu"] for r in recs} == {3} and not any(r["stale"] for r in recs)
        assert registrations.charged(state_dir, gpu=3) == 4 << 20
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert registrations.list_all(state_dir) == []
    finally:
        proc.kill()


def test_gate_slot_is_held_only_around_register(tmp_path, state_dir):
    from gpuwarden.ops.foundation import gate
    arena = make_arena(tmp_path / "a.arena")
    gate_dir = tmp_path / "gate"
    env = {"GPUWARDEN_GATE_DIR": str(gate_dir), "GPUWARDEN_GATE_SLOTS": "1"}
    held = gate.acquire(gate_dir, 1, who="test")
    try:
        s1 = tmp_path / "1.status"
        p1 = spawn(arena, s1, state_dir, "--runtime", "sim", "--gate-timeout", "0.5", env=env)
        assert p1.wait(20) == 2
        assert "no registration slot free" in p1.stderr.read()
        phases = [e.phase for e in read_events(s1)]
        assert phases[-1] == "exited" and "registering" not in phases  # never got to call register
    finally:
        held.release()
    s2 = tmp_path / "2.status"
    p2 = spawn(arena, s2, state_dir, "--runtime", "sim", env=env)
    try:
        wait_phase(s2, "serving", p2)
        assert gate.holders(gate_dir, 1) == [], "the slot must be released once registered"
        p2.send_signal(signal.SIGTERM)
        assert p2.wait(20) == 0
    finally:
        p2.kill()


def test_help_explains_both_entries(cli):
    mod = subprocess.run([sys.executable, "-m", "gpuwarden.ops.canary", "--help"], cwd=REPO, capture_output=True, text=True)
    assert mod.returncode == 0 and "--crash-at" in mod.stdout and "status protocol" in mod.stdout
    typer_help = cli("canary", "--help")
    assert typer_help.returncode == 0 and "--hang-at" in typer_help.stdout and "SIGTERM" in typer_help.stdout
    for sub in ("create", "verify", "inspect", "budget", "probe"):
        h = cli("arena", sub, "--help")
        assert h.returncode == 0 and "--json" in h.stdout, sub


def test_pin_is_the_sim_runtimes_and_a_failed_pin_is_reported_or_crashes(tmp_path, state_dir):
    from gpuwarden.ops.arena.create import create
    arena = tmp_path / "a.arena"
    create(arena, size=1 << 20)
    status = tmp_path / "s.jsonl"
    host = spawn(arena, status, state_dir, "--runtime", "host", "--pin", "1MiB")
    out, err = host.communicate(timeout=30)
    assert host.returncode == 2 and "--pin is modelled by the sim runtime only" in err
    limit = {"GPUWARDEN_SIM_KFD_LIMIT": f"{(1 << 20) + (1 << 19)}B"}  # the registration fits, 1 MiB more does not
    report = spawn(arena, tmp_path / "r.jsonl", state_dir, "--runtime", "sim", "--pin", "1MiB", "--on-pin-failure",
                   "report", "--verify", "none", "--copy-buffer", "0", env=limit)
    out, err = report.communicate(timeout=30)
    assert report.returncode == 2 and "hipHostMalloc of 1.0 MiB returned hipErrorOutOfMemory" in err, err
    crash = spawn(arena, tmp_path / "c.jsonl", state_dir, "--runtime", "sim", "--pin", "1MiB", "--verify", "none",
                  "--copy-buffer", "0", env=limit)
    out, err = crash.communicate(timeout=30)
    assert crash.returncode == -11 and "libamdhip64.so.7" in out and "session is up" in out, (out, err)
