"""The shim with real processes: detached, exit records, restart policy, stop escalation, stale records, log cap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from engines.harness import engine_argv, supervised  # noqa: F401
from helpers.simnode import ignores, proc_state, wait_for

from helpers.journal import read_journal
from gpuwarden.ops.node import procs
from gpuwarden.ops.engines import control
from gpuwarden.ops.engines import state as st
from gpuwarden.ops.config.nodeconfig import EngineConfig
from gpuwarden.ops.foundation.settings import Settings


def _start(state_dir, *args, name="e0", gpu=2, **keys):
    settings = Settings(state_dir=state_dir)
    engine = EngineConfig(name=name, argv=tuple(engine_argv("--register-s", "0.05", *args)), gpu=gpu, **keys)
    shim = control.start(settings, engine, gate_slots=1, registration_timeout=30, workdir=None)
    control.wait_for_record(settings, name, shim)
    return settings, shim


def _phase(state_dir, name="e0"):
    return (st.read_state(state_dir, name) or {}).get("phase")


def test_shim_is_detached_and_ignores_hangup(supervised):
    settings, shim = _start(supervised)
    wait_for(lambda: _phase(supervised) == "serving", 10, "serving")
    # Its own session, not ours: closing our terminal cannot reach it.
    assert os.getsid(shim) != os.getsid(0)
    assert os.getsid(shim) != shim  # not a session leader either, so it can never gain a terminal
    # Ignored signals are dropped when sent, so once the mask says so the hangup cannot end it later.
    assert ignores(shim, signal.SIGHUP)
    os.kill(shim, signal.SIGHUP)
    assert st.shim_alive(st.read_state(supervised, "e0"))
    record = st.read_state(supervised, "e0")
    env = procs.ProcReader().visibility(record["pid"])
    if env:
        assert env.get("CUDA_VISIBLE_DEVICES") == "2"
    assert "CUDA_VISIBLE_DEVICES=2" in (st.engine_dir(supervised, "e0") / st.LOG).read_text()


def test_exit_code_and_signal_are_recorded(supervised):
    _start(supervised, "--exit-after-register", "3", name="bad")
    wait_for(lambda: _phase(supervised, "bad") == "crashed", 10, "crashed")
    record = st.read_state(supervised, "bad")
    assert record["exit_code"] == 3 and record["signal"] is None
    _start(supervised, "--crash-at-overlap", "1", "--marker-dir", str(supervised / "m"), name="segv")
    wait_for(lambda: _phase(supervised, "segv") == "crashed", 10, "crashed")
    record = st.read_state(supervised, "segv")
    assert record["signal"] == "SIGSEGV" and isinstance(record["core_dumped"], bool)
    assert record["died_while"] == "registering" and record["exit_code"] is None
    # The shim records the phase first and journals right after: wait for the line, don't race it.
    def journalled():
        lines = (supervised / "journal.log").read_text().splitlines()
        return any("engine-exit" in line and '"signal": "SIGSEGV"' in line and '"crashed"' in line for line in lines)
    wait_for(journalled, 10, "the engine-exit journal line")
    info = st.get(Settings(state_dir=supervised), "segv")
    assert info.signal == "SIGSEGV" and info.last_log_line.startswith("segfault")
    # Death by a signal asks for an incident bundle, whose path lands in the record (and the snapshot).
    wait_for(lambda: (st.read_state(supervised, "segv") or {}).get("bundle"), 60, "the crash bundle", poll=0.1)
    bundle = st.get(Settings(state_dir=supervised), "segv").bundle
    assert bundle.endswith(".tar.gz") and os.path.exists(bundle)


def test_restart_on_failure_stops_at_the_start_limit(supervised):
    settings, _ = _start(supervised, "--exit-after-register", "1", restart="on-failure", restart_backoff=0.05,
                         start_limit_burst=3, start_limit_interval=60)
    wait_for(lambda: "start limit" in (st.read_state(supervised, "e0") or {}).get("detail", ""), 20,
             "the start limit")
    record = st.read_state(supervised, "e0")
    assert record["restarts"] == 2 and record["phase"] == "crashed" and record["exit_code"] == 1
    wait_for(lambda: not st.shim_alive(st.read_state(supervised, "e0")), 5, "the shim to finish")
    log = (st.engine_dir(supervised, "e0") / st.LOG).read_text()
    assert log.count(st.RUN_MARK) == 3


def test_stop_escalates_to_sigkill_after_grace(supervised):
    settings, shim = _start(supervised, "--ignore-term", stop_grace=0.3)
    wait_for(lambda: _phase(supervised) == "serving", 10, "serving")
    t0 = time.monotonic()
    result = control.stop(settings, "e0")
    assert result.result == "stopped"
    assert 0.3 <= time.monotonic() - t0 < 15  # the grace was kept, and the kill came (a busy machine is slow)
    record = st.read_state(supervised, "e0")
    assert record["signal"] == "SIGKILL" and record["phase"] == "exited" and record["stopped_by_request"]
    actions = [line for line in (supervised / "journal.log").read_text().splitlines() if "engine-signal" in line]
    assert actions and '"role": "shim"' in actions[0]


def test_stale_record_and_direct_stop(supervised):
    settings, shim = _start(supervised)
    wait_for(lambda: _phase(supervised) == "serving", 10, "serving")
    os.kill(shim, signal.SIGKILL)
    wait_for(lambda: st.get(settings, "e0").stale, 5, "stale")
    info = st.get(settings, "e0")
    assert info.phase == "stale"
    record = st.read_state(supervised, "e0")
    assert st.alive(record["pid"], record["pid_start"])
    result = control.stop(settings, "e0", timeout_s=2)
    assert result.result in ("stopped", "killed")
    assert not st.alive(record["pid"], record["pid_start"])
    assert st.get(settings, "e0").phase == "exited"


def test_reused_pid_is_never_signalled(supervised):
    settings = Settings(state_dir=supervised)
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        real = procs.identity(bystander.pid)
        d = st.engine_dir(supervised, "ghost")
        d.mkdir(parents=True)
        from gpuwarden.ops.foundation import statedir
        # A record whose pids now name another process (other start time): what a reboot or pid wrap leaves.
        statedir.write_json(d / st.STATE, {"name": "ghost", "phase": "serving", "shim_pid": bystander.pid,
                                           "shim_start": real - 1, "pid": bystander.pid, "pid_start": real - 1},
                           root=supervised)
        assert st.get(settings, "ghost").stale
        assert control.stop(settings, "ghost", timeout_s=0.2).result == "not-running"
        time.sleep(0.1)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_log_is_capped(supervised):
    _start(supervised, "--spam", "200000", log_max=8192)
    wait_for(lambda: _phase(supervised) == "serving", 10, "serving")
    log = st.engine_dir(supervised, "e0") / st.LOG
    wait_for(lambda: "00001999" in log.read_text(errors="replace"), 10, "the last filler line")
    total = log.stat().st_size + log.with_name(st.LOG + ".1").stat().st_size
    assert total <= 8192
    assert st.last_line(log).startswith("00001999")


def test_registration_timeout_frees_the_shims_gate_slot(supervised):
    # A log-followed engine that never prints its registered line must not hold the gate for ever.
    keys = dict(progress="log", registered_pattern="never printed")
    settings = Settings(state_dir=supervised)
    for name in ("slow", "next"):
        engine = EngineConfig(name=name, argv=tuple(engine_argv("--register-s", "0", "--log-only")), gpu=0, **keys)
        # slow holds the slot 3 s: long enough to see next start and wait behind it on a loaded machine (0.6 s
        # was not: next's shim could start after slow's timeout and never be seen waiting).
        shim = control.start(settings, engine, gate_slots=1, registration_timeout=3.0, workdir=None)
        control.wait_for_record(settings, name, shim)
        if name == "slow":
            wait_for(lambda: (st.read_state(supervised, "slow") or {}).get("gate_slot") == 0, 5, "slow holding")
    # The shim records "waiting" just after its first record: poll for it.
    wait_for(lambda: (st.read_state(supervised, "next") or {}).get("phase") == "waiting", 5, "next waiting")
    assert (st.read_state(supervised, "next") or {}).get("gate_slot") is None
    wait_for(lambda: (st.read_state(supervised, "next") or {}).get("gate_slot") == 0, 10, "next admitted")
    slow = st.read_state(supervised, "slow")
    assert slow["gate_slot"] is None and "registration timeout" in slow["detail"]


def test_a_status_event_with_a_non_string_call_does_not_kill_the_shim(supervised):
    # The engine's status events are its own words: a "call" that is not a function name must still be recorded,
    # not raise in the shim (which would leave the engine unsupervised).
    script = ("import time\nfrom gpuwarden.ops.foundation.status_protocol import StatusWriter\nw = StatusWriter()\n"
              "w.emit('registering', call=5, bytes=64)\nw.emit('register-failed', call=5, bytes=64, result=2)\n"
              "print('serving', flush=True)\ntime.sleep(60)\n")
    settings = Settings(state_dir=supervised)
    engine = EngineConfig(name="odd", argv=(sys.executable, "-c", script), gpu=0)
    shim = control.start(settings, engine, gate_slots=1, registration_timeout=30, workdir=None)
    control.wait_for_record(settings, "odd", shim)
    wait_for(lambda: "returned error 2" in ((st.read_state(supervised, "odd") or {}).get("detail") or ""), 10,
             "the failed registration recorded")
    assert control.supervised(settings, "odd")
    assert control.stop(settings, "odd", timeout_s=5).result in ("stopped", "killed")


def test_an_exited_engines_leftover_children_are_killed_and_journalled(supervised, tmp_path):
    # The engine forks a child into its own process group and exits: the child would keep GPU memory.
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys; c = subprocess.Popen(['sleep', '60']); "
            "open(sys.argv[1], 'w').write(str(c.pid))")
    settings = Settings(state_dir=supervised)
    engine = EngineConfig(name="forker", argv=(sys.executable, "-c", code, str(pidfile)), gpu=0)
    shim = control.start(settings, engine, gate_slots=1, registration_timeout=30, workdir=None)
    control.wait_for_record(settings, "forker", shim)
    wait_for(lambda: _phase(supervised, "forker") == "exited", 10, "the engine to exit")
    child = int(pidfile.read_text())
    wait_for(lambda: proc_state(child) in (None, "Z"), 5, "the leftover child to die")
    lines = read_journal(supervised)
    killed = [x for x in lines if x.get("action") == "engine-leftovers"]
    assert len(killed) == 1 and killed[0]["pids"] == [child] and killed[0]["engine"] == "forker"
    assert st.read_state(supervised, "forker")["exit_code"] == 0


def test_an_engine_that_leaves_nothing_behind_gets_no_leftover_line(supervised):
    _start(supervised, "--exit-after-register", "0", name="clean")
    wait_for(lambda: _phase(supervised, "clean") == "exited", 10, "exited")
    # The shim saves the phase, then journals the exit; its leftover check comes before both. So the
    # exit line is the moment to look (the phase alone raced the journal on a loaded machine).
    journal = wait_for(lambda: "engine-exit" in (text := (supervised / "journal.log").read_text()) and text,
                       10, "the engine-exit journal line")
    assert "engine-leftovers" not in journal
