"""The reaper with real processes: checked identity, TERM then KILL, zombies reaped via their parent, refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from gpuwarden.ops.node import procs
from gpuwarden.ops.clean.reaper import Reaper, Target, untouchable
from helpers.journal import read_journal
from helpers.simnode import ignores
from helpers.simnode import proc_state, wait_for
from helpers.reaper_family import start_family


_journal = read_journal


def _reaper(settings, **kw):
    kw.setdefault("grace_s", 1.0)
    kw.setdefault("kill_wait_s", 3.0)
    kw.setdefault("orphan_wait_s", 5.0)
    return Reaper(settings, **kw)


def test_reused_pid_is_never_signalled(settings):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        ticks = procs.identity(victim.pid)
        # The holder recorded earlier had another start time: this PID now names an unrelated process.
        out = _reaper(settings).handle(Target(victim.pid, ticks + 1, "dead-tenant", "sleep 30"))
        assert out.result == "skipped" and "another process" in out.detail
        time.sleep(0.1)
        assert victim.poll() is None, "the unrelated process was killed"
        assert proc_state(victim.pid) == "S"
        entries = _journal(settings.state_dir)
        assert any(e["action"] == "reaper" and e["result"] == "skipped" for e in entries)
        assert not any(e["action"] == "reaper-signal" and e["result"] == "ok" for e in entries)
    finally:
        victim.kill()
        victim.wait()


def test_send_rechecks_identity_right_before_the_signal(settings):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        ticks = procs.identity(victim.pid)
        r = _reaper(settings)
        assert r.send(victim.pid, ticks + 7, signal.SIGKILL, role="holder", target=victim.pid, why="t") == "gone"
        assert victim.poll() is None
        assert r.send(victim.pid, ticks, signal.SIGKILL, role="holder", target=victim.pid, why="t") == "sent"
        assert victim.wait(5) == -signal.SIGKILL
        lines = [e for e in _journal(settings.state_dir) if e["action"] == "reaper-signal"]
        assert [e["result"] for e in lines] == ["skipped", "ok"]
        assert lines[1]["signal"] == "SIGKILL" and lines[1]["pid"] == victim.pid
    finally:
        victim.kill()
        victim.wait()


def test_stubborn_tenant_gets_term_then_kill(settings):
    # Ignores SIGTERM, like a tenant stuck in its own shutdown.
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    fam = start_family([sys.executable, "-c", code], mode="direct")
    try:
        ticks = procs.identity(fam.tenant)
        assert wait_for(lambda: ignores(fam.tenant, signal.SIGTERM), 10)
        out = _reaper(settings, grace_s=0.5).handle(Target(fam.tenant, ticks, "dead-tenant"))
        assert out.result == "removed", out
        assert [s.split("->")[0] for s in out.signals] == ["SIGTERM", "SIGKILL"]
        assert procs.identity(fam.tenant) != ticks
        assert fam.keeper.poll() is None, "the subreaper must survive"
    finally:
        fam.stop()


def test_zombie_reaped_by_ending_its_careless_parent(settings):
    fam = start_family(["sleep", "60"])
    unrelated = subprocess.Popen(["sleep", "60"])
    try:
        ticks = procs.identity(fam.tenant)
        os.kill(fam.tenant, signal.SIGKILL)
        assert wait_for(lambda: proc_state(fam.tenant) == "Z", 5)
        out = _reaper(settings).handle(Target(fam.tenant, ticks, "zombie"))
        assert out.result == "removed", out
        assert f"SIGCHLD->{fam.parent}" in out.signals and f"SIGTERM->{fam.parent}" in out.signals
        assert proc_state(fam.tenant) is None and proc_state(fam.parent) is None
        assert unrelated.poll() is None and fam.keeper.poll() is None
        sigs = [(e["pid"], e["signal"]) for e in _journal(settings.state_dir)
                if e["action"] == "reaper-signal" and e["result"] == "ok"]
        assert sigs[:2] == [(fam.parent, "SIGCHLD"), (fam.parent, "SIGTERM")]
        assert all(pid != unrelated.pid for pid, _ in sigs)
    finally:
        unrelated.kill()
        unrelated.wait()
        fam.stop()


def test_zombie_of_an_untouchable_parent_is_reported_not_forced(settings):
    # The zombie's parent is this very process (gpuwarden's own side): it must be left alone.
    child = subprocess.Popen(["sleep", "60"])
    try:
        ticks = procs.identity(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        assert wait_for(lambda: proc_state(child.pid) == "Z", 5)
        out = _reaper(settings, reap_wait_s=0.2).handle(Target(child.pid, ticks, "zombie"))
        assert out.result == "reported"
        assert "this gpuwarden" in out.detail and out.next_step
        assert proc_state(child.pid) == "Z"
    finally:
        child.wait()


def test_untouchable_names_the_reason():
    assert "PID 1" in untouchable(1)
    assert "this gpuwarden" in untouchable(os.getpid())
    kthreadd = 2 if os.path.exists("/proc/2/stat") else None
    if kthreadd:
        assert untouchable(2) is not None
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert untouchable(sleeper.pid) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_disk_sleep_is_reported_not_signalled(settings, tmp_path):
    # A real D-state process cannot be made on demand here; a captured proc tree stands in.
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "stat").write_text(
        "4242 (pt_main_thread) D 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0\n")
    (proc / "stat").write_text("btime 1700000000\n")
    r = Reaper(settings.with_(proc_root=proc))
    out = r.handle(Target(4242, 777, "disk-sleep"))
    assert out.result == "reported" and "uninterruptible" in out.detail and out.next_step
    assert not any(e["action"] == "reaper-signal" for e in _journal(settings.state_dir))


def test_a_containers_init_is_untouchable():
    # A real PID namespace: `unshare -pf` makes its child PID 1 there, as a container runtime does.
    import shutil
    if os.geteuid() != 0 or not shutil.which("unshare"):
        import pytest
        pytest.skip("needs root and unshare to make a PID namespace")
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "60"])
    try:
        def child():
            for line in open(f"/proc/{outer.pid}/task/{outer.pid}/children").read().split():
                return int(line)
        pid = wait_for(child, 5)
        assert "init (PID 1) of a container's PID namespace" in untouchable(pid)
        assert untouchable(outer.pid) is None  # unshare itself is an ordinary process here
    finally:
        outer.kill()
        outer.wait()
