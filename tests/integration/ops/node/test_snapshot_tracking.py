"""What changes between two refreshes shows at the next one, though the Sampler re-reads little (pidfds, reuse).

Real processes hold simulated VRAM; every case runs with pidfds and with the fallback that reads each stat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.simnode import proc_state, start_tenant, wait_for
from helpers.purge import spawn_with_pid

from gpuwarden.ops.node import procs
from gpuwarden.ops.node.backends.sysfs import SysfsBackend
from gpuwarden.ops.foundation.fdbudget import FdBudget
from gpuwarden.ops.foundation.pidwatch import PidWatch, usable
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.sampling.sampler import Sampler

MiB = 1 << 20


@pytest.fixture(params=["pidfd", "stat"])
def tracked(request, state_dir):
    """(sampler, node): a 2-GPU sim node read through the sysfs backend, so the test decides when the
    simulated driver syncs (drops the allocations of processes that are gone)."""
    if request.param == "pidfd" and not usable(Path("/proc")):
        pytest.skip("pidfd_open is not available here (kernel < 5.3, seccomp, or another PID namespace)")
    node = SimNode(state_dir)
    node.init(gpus=2, vram=4 << 30)
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    sampler = Sampler(Settings(state_dir=state_dir), backend, deep_every_s=1e9,
                      use_pidfds=request.param == "pidfd")
    assert (sampler._watch is not None) == (request.param == "pidfd")
    sampler.snapshot(deep=True)
    children: list[subprocess.Popen] = []
    yield sampler, node, children
    sampler.close()
    for p in children:
        p.kill()
        p.wait()


def holding(node: SimNode, children: list, gpu: int, size: int, argv=("sleep", "60")) -> subprocess.Popen:
    """A real process charged `size` of simulated VRAM, once it sleeps (a fresh exec passes through
    disk sleep and running)."""
    proc = subprocess.Popen(list(argv))
    children.append(proc)
    wait_for(lambda: proc_state(proc.pid) == "S", what="the child to sleep")
    node.allocate(proc.pid, gpu, size)
    return proc


def entry(snap, pid: int):
    return next((p for p in snap.processes if p.pid == pid), None)


def holders(snap, gpu: int) -> list:
    return [h for r in snap.residual if r.gpu_index == gpu for h in r.holders]


def test_killed_unreaped_process_is_a_zombie_at_the_next_refresh_and_leaves_once_reaped(tracked):
    sampler, node, children = tracked
    p = holding(node, children, 0, 64 * MiB)
    first = entry(sampler.snapshot(deep=False), p.pid)
    assert first is not None and first.state == "sleeping" and first.vram == {0: 64 * MiB}

    os.kill(p.pid, signal.SIGKILL)
    wait_for(lambda: proc_state(p.pid) == "Z", what="the child to become a zombie")
    node.sync()  # a zombie keeps its context, as under KFD
    snap = sampler.snapshot(deep=False)
    assert entry(snap, p.pid).state == "zombie"
    assert [(h.pid, h.reason, h.vram_bytes) for h in holders(snap, 0)] == [(p.pid, "zombie", 64 * MiB)]

    p.wait()
    node.sync()
    snap = sampler.snapshot(deep=False)
    assert entry(snap, p.pid) is None and not holders(snap, 0)
    if sampler._watch is not None:
        assert p.pid not in sampler._watch  # no pidfd kept for a process that left


def test_reaped_process_the_driver_still_charges_is_gone(tracked):
    sampler, node, children = tracked
    p = holding(node, children, 1, 32 * MiB)
    assert entry(sampler.snapshot(deep=False), p.pid).state == "sleeping"
    p.kill()
    p.wait()  # reaped at once; no driver sync, so its KFD entry stays: a context without a process
    snap = sampler.snapshot(deep=False)
    assert entry(snap, p.pid).state == "gone"
    assert [(h.pid, h.reason) for h in holders(snap, 1)] == [(p.pid, "kfd-without-process")]


def test_new_tenant_appears_and_vram_changes_show_at_the_next_refresh(tracked, state_dir):
    sampler, node, children = tracked
    before = sampler.snapshot(deep=False)
    tenant = start_tenant(state_dir, 1, "96MiB")
    children.append(tenant)
    p = entry(sampler.snapshot(deep=False), tenant.pid)
    assert p is not None and p.vram == {1: 96 * MiB} and "sim hold" in p.command and p.state != "gone"
    assert tenant.pid not in {q.pid for q in before.processes}

    node.allocate(tenant.pid, 1, 32 * MiB)  # the same file now reads another number
    node.allocate(tenant.pid, 0, 16 * MiB)  # and a second GPU
    assert entry(sampler.snapshot(deep=False), tenant.pid).vram == {1: 128 * MiB}  # new files: next listing
    for _ in range(SysfsBackend.RELIST_EVERY):
        last = entry(sampler.snapshot(deep=False), tenant.pid)
    assert last.vram == {0: 16 * MiB, 1: 128 * MiB}

    node.free(tenant.pid)  # alive, but no longer a GPU process
    assert entry(sampler.snapshot(deep=False), tenant.pid) is None
    if sampler._watch is not None:
        assert tenant.pid not in sampler._watch


def test_a_reused_pid_is_a_new_process_at_the_next_refresh(tracked):
    sampler, node, children = tracked
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to choose the next PID (ns_last_pid)")
    old = holding(node, children, 0, 64 * MiB)
    old_ticks = procs.identity(old.pid)
    was = entry(sampler.snapshot(deep=False), old.pid)
    assert was.command == "sleep 60"
    old.kill()
    old.wait()
    node.sync()  # its allocation and its KFD directory go
    # Start times count in clock ticks: the next process must not share the old one's tick.
    hz = os.sysconf("SC_CLK_TCK")
    wait_for(lambda: time.clock_gettime(time.CLOCK_BOOTTIME) * hz > old_ticks + 1, what="the next clock tick")
    new = spawn_with_pid(old.pid, ["sleep", "61"])
    if new is None:
        pytest.skip("could not get the freed PID back (the machine forks too much right now)")
    children.append(new)
    wait_for(lambda: proc_state(new.pid) == "S", what="the new process to sleep")  # a fresh exec runs first
    node.allocate(new.pid, 1, 128 * MiB)  # a new KFD directory under the same PID
    now = entry(sampler.snapshot(deep=False), old.pid)
    assert now.command == "sleep 61" and now.start_time > was.start_time
    assert now.vram == {1: 128 * MiB} and now.state == "sleeping"
    if sampler._watch is not None:
        assert old.pid in sampler._watch and old.pid not in sampler._watch.exited()  # watching the new one


def test_state_changes_other_than_exit_show_at_the_deep_scan_cadence(tracked):
    sampler, node, children = tracked
    p = holding(node, children, 0, 16 * MiB)
    assert entry(sampler.snapshot(deep=False), p.pid).state == "sleeping"
    os.kill(p.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(p.pid) == "T", what="the child to stop")
    sampler.deep_every_s = 0  # the next refresh is a deep one
    assert entry(sampler.snapshot(), p.pid).state == "stopped"


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def freezer_group():
    """A cgroup v1 freezer group: its frozen tasks show as disk sleep (D) in stat, a real D state on demand."""
    if not os.access(FREEZER, os.W_OK):
        pytest.skip("needs root and the cgroup v1 freezer to put a process in disk sleep")
    group = FREEZER / f"gpuwarden-test-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        for pid in (group / "cgroup.procs").read_text().split():
            (FREEZER / "cgroup.procs").write_text(pid)
        group.rmdir()


def test_disk_sleep_is_seen_at_the_deep_cadence_and_its_end_at_the_next_refresh(tracked, freezer_group):
    sampler, node, children = tracked
    p = holding(node, children, 1, 48 * MiB)
    assert entry(sampler.snapshot(deep=False), p.pid).state == "sleeping"
    (freezer_group / "cgroup.procs").write_text(str(p.pid))
    (freezer_group / "freezer.state").write_text("FROZEN")
    wait_for(lambda: proc_state(p.pid) == "D", what="the frozen child to show disk sleep")
    sampler.deep_every_s = 0
    snap = sampler.snapshot()
    assert entry(snap, p.pid).state == "disk-sleep"
    assert [(h.pid, h.reason) for h in holders(snap, 1)] == [(p.pid, "disk-sleep")]
    sampler.deep_every_s = 1e9
    (freezer_group / "freezer.state").write_text("THAWED")
    wait_for(lambda: proc_state(p.pid) == "S", what="the thawed child to sleep again")
    snap = sampler.snapshot(deep=False)
    assert entry(snap, p.pid).state == "sleeping" and not holders(snap, 1)


def test_pidwatch_reports_a_zombie_before_it_is_reaped_and_after():
    child = subprocess.Popen(["sleep", "60"])
    watch = PidWatch(limit=8)
    try:
        if not usable(Path("/proc")):
            pytest.skip("pidfd_open is not available here")
        assert watch.track(child.pid) and watch.exited() == set()
        child.kill()
        wait_for(lambda: proc_state(child.pid) == "Z", what="the child to become a zombie")
        assert watch.exited() == {child.pid}
        child.wait()
        assert watch.exited() == {child.pid}
        watch.forget(child.pid)
        assert watch.exited() == set() and len(watch) == 0
        assert not watch.track(child.pid)  # no such process any more
    finally:
        child.kill()
        child.wait()
        watch.close()


def test_pidfds_are_not_used_on_a_captured_proc_tree(tmp_path):
    (tmp_path / "self").symlink_to("1")
    assert not usable(tmp_path)
    assert usable(Path("/proc")) == hasattr(os, "pidfd_open")


def test_pidwatch_declines_past_its_limit():
    watch = PidWatch(limit=1)
    try:
        assert watch.track(os.getpid())
        assert not watch.track(os.getppid())
    finally:
        watch.close()


def test_pidwatch_close_while_a_forget_runs_closes_each_descriptor_once(monkeypatch):
    # A read abandoned at its deadline may still forget() a process while the owner closes the watch (Ctrl-C in
    # a drain's wait): a forget() that runs between two of close()'s closes must not make either close a
    # descriptor twice (EBADF, or another file's descriptor given the same number since).
    if not usable(Path("/proc")):
        pytest.skip("pidfd_open is not available here")
    budget = FdBudget(10)
    watch = PidWatch(limit=8, budget=budget)
    assert watch.track(os.getpid()) and watch.track(os.getppid())
    fds = set(watch._fd_of.values())
    closed: list[int] = []
    real_close = os.close

    def close_and_let_the_other_thread_run(fd: int) -> None:
        closed.append(fd)
        real_close(fd)
        if len(closed) == 1:
            for pid in watch.pids():  # the abandoned reader forgets what is still tracked
                watch.forget(pid)

    monkeypatch.setattr(os, "close", close_and_let_the_other_thread_run)
    watch.close()
    monkeypatch.undo()
    assert sorted(closed) == sorted(fds) and len(watch) == 0
    assert budget.take(10)  # every descriptor given back once: none counted twice, none lost
