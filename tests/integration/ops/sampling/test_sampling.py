"""The sampling package's own promises: incremental deep scans, the steady-state refresh, one descriptor budget,
state owned by the sampler (FileCache), and structured warnings that read back from older JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from helpers.simnode import wait_for

from gpuwarden.ops.node.backends.sysfs import SysfsBackend
from gpuwarden.ops.foundation.fdbudget import FdBudget
from gpuwarden.ops.foundation.heldfiles import HeldFiles
from gpuwarden.ops.foundation.model import NodeSnapshot, SnapshotWarning, snapshot_from_dict
from gpuwarden.ops.foundation.filecache import FileCache
from gpuwarden.ops.sampling.sampler import Sampler
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode

MiB = 1 << 20
HOLD = "import sys, time; f = open(sys.argv[1]); print('up', flush=True); time.sleep(60)"


def _holder(path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    return p


def test_incremental_deep_scans_find_new_holders_and_full_ones_find_the_rest(state_dir):
    node = SimNode(state_dir)
    node.init(gpus=1, vram=1 << 30)
    sampler = Sampler(Settings(state_dir=state_dir), SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root),
                      deep_every_s=0.0, full_scan_every_s=3600.0)
    # Known before the first scan, opening the device only later: a non-holder the increments skip.
    late = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.readline(); "
                             f"f = open({str(node.render_node(0))!r}); print('up', flush=True); time.sleep(60)"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        sampler.snapshot(deep=True)  # full
        fresh = _holder(node.render_node(0))  # started after it: found by the next increment
        late.stdin.write("go\n")
        late.stdin.flush()
        assert late.stdout.readline().strip() == "up"
        pids = {p.pid for p in sampler.snapshot().processes}
        assert fresh.pid in pids and late.pid not in pids
        sampler.full_scan_every_s = 0.0
        assert late.pid in {p.pid for p in sampler.snapshot().processes}
        fresh.kill()
        fresh.wait()
    finally:
        late.kill()
        late.wait()
        sampler.close()


def test_a_steady_refresh_repeats_the_last_one_and_a_change_breaks_it(state_dir):
    node = SimNode(state_dir)
    node.init(gpus=1, vram=1 << 30)
    sampler = Sampler(Settings(state_dir=state_dir), SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root),
                      deep_every_s=1e9)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        node.allocate(sleeper.pid, 0, 64 * MiB)
        sampler.snapshot(deep=True)
        a, b = sampler.snapshot(), sampler.snapshot()
        if sampler._watch is not None:
            assert a.processes is b.processes  # nothing changed: the same tuple, no per-process work
        node.allocate(sleeper.pid, 0, 64 * MiB)
        assert sampler.snapshot().processes[0].vram == {0: 128 * MiB}
        sleeper.kill()
        sleeper.wait()
        node.sync()
        wait_for(lambda: not sampler.snapshot().processes, what="the gone process to leave the snapshot")
    finally:
        sleeper.kill()
        sleeper.wait()
        sampler.close()


def test_held_files_and_pidfds_share_one_budget(tmp_path):
    budget = FdBudget(total=3)
    a, b = HeldFiles(budget=budget), HeldFiles(budget=budget)
    paths = []
    for i in range(4):
        p = tmp_path / f"f{i}"
        p.write_text(str(i))
        paths.append(str(p))
    assert a.read(paths[0]) == b"0" and a.read(paths[1]) == b"1" and b.read(paths[2]) == b"2"
    assert budget.left == 0
    assert b.read(paths[3]) == b"3" and len(b) == 1  # read without keeping a descriptor past the budget
    a.close()
    assert budget.left == 2


def test_file_cache_parses_again_only_after_a_change_and_forgets_unasked_files(tmp_path):
    cache, calls = FileCache(), []
    f = tmp_path / "state.json"
    f.write_text('{"a": 1}')

    def parse(path):
        calls.append(path)
        return json.loads(path.read_text())
    assert cache.get(f, parse, "j") == {"a": 1} and cache.get(f, parse, "j") == {"a": 1} and len(calls) == 1
    time.sleep(0.01)
    f.write_text('{"a": 22}')
    os.utime(f, ns=(time.time_ns(), time.time_ns()))
    assert cache.get(f, parse, "j") == {"a": 22} and len(calls) == 2
    cache.sweep()
    cache.sweep()  # asked for nothing during a whole refresh: forgotten
    assert len(cache) == 0


def test_warnings_are_codes_with_messages_and_old_string_warnings_still_load():
    old = {"taken_at": 1.0, "hostname": "h", "backend": "sim", "simulated": True, "gpus": [], "processes": [],
           "residual": [], "warnings": ["SIMULATED node: no GPU", "GPU 3: something old"]}
    snap = snapshot_from_dict(old)
    assert [w.code for w in snap.warnings] == ["simulated", "other"] and str(snap.warnings[1]) == "GPU 3: something old"
    doc = snap.to_dict()
    assert doc["warnings"][0] == {"code": "simulated", "message": "SIMULATED node: no GPU", "gpu": None}
    assert doc["taken_at_iso"] == "1970-01-01T00:00:01.000Z" and list(doc)[0] == "schema"
    again = snapshot_from_dict(json.loads(snap.to_json()))
    assert again.warnings == snap.warnings
    made = NodeSnapshot(taken_at=0, hostname="h", backend="x", simulated=False, gpus=(), processes=(), residual=(),
                        warnings=(SnapshotWarning("ownerless-leak", "GPU 0: leak", 0),))
    assert made.warning_codes() == {"ownerless-leak"}


def test_an_unchanged_kfd_refresh_repeats_itself_and_any_change_is_seen(state_dir):
    """The steady state hands back the very same usage list; a changed vram file, a new process and a gone one
    each break the repeat at once (not at the next relisting)."""
    node = SimNode(state_dir)
    node.init(gpus=2, vram=1 << 30)
    a, b = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        node.allocate(a.pid, 0, 8 * MiB)
        backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
        first = backend.process_usage()
        assert backend.process_usage() is first
        node.allocate(a.pid, 0, 8 * MiB)
        grown = backend.process_usage()
        assert grown is not first and [(u.pid, u.gpu_index, u.vram_bytes) for u in grown] == [(a.pid, 0, 16 * MiB)]
        node.allocate(b.pid, 1, 4 * MiB)
        assert sorted((u.pid, u.vram_bytes) for u in backend.process_usage()) == [(a.pid, 16 * MiB), (b.pid, 4 * MiB)]
        node.free(a.pid)
        assert [u.pid for u in backend.process_usage()] == [b.pid]
        backend.close()
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_an_unchanged_engine_is_the_same_engine_info_until_its_record_or_shim_changes(state_dir):
    from gpuwarden.ops.engines.state import list_engines
    shim = subprocess.Popen(["sleep", "60"])
    try:
        d = state_dir / "engines" / "e0"
        d.mkdir(parents=True)
        record = {"name": "e0", "gpu": 0, "phase": "serving", "shim_pid": shim.pid, "pid": shim.pid, "restarts": 0,
                  "shim_start": int((open(f"/proc/{shim.pid}/stat").read().rsplit(")", 1)[1].split())[19])}
        (d / "state.json").write_text(json.dumps(record))
        settings, cache, memo = Settings(state_dir=state_dir), FileCache(), {}
        first = list_engines(settings, cache, memo)[0]
        assert first.phase == "serving" and list_engines(settings, cache, memo)[0] is first
        (d / "state.json").write_text(json.dumps({**record, "restarts": 1}))
        os.utime(d / "state.json", ns=(time.time_ns() + 10**9,) * 2)  # a new stamp even on a coarse clock
        again = list_engines(settings, cache, memo)[0]
        assert again is not first and again.restarts == 1
        shim.kill()
        shim.wait()
        assert list_engines(settings, cache, memo)[0].phase == "stale"
        d.joinpath("state.json").unlink()
        assert list_engines(settings, cache, memo) == [] and memo == {}
    finally:
        shim.kill()
        shim.wait()


def test_waiting_on_a_descriptor_above_select_s_limit():
    """The agent holds thousands of files on a busy node: its waits must work on descriptor 2000 and up."""
    import os
    import resource
    from gpuwarden.ops.foundation.waitfd import readable
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2100:
        import pytest
        pytest.skip(f"the open-files limit ({hard}) is below 2100")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2100), hard))
    r, w = os.pipe()
    high_r, high_w = os.dup2(r, 2050), os.dup2(w, 2051)
    try:
        assert not readable(high_r, 0)
        os.write(high_w, b"x")
        assert readable(high_r, 1)
        os.read(high_r, 1)
        os.close(high_w)
        os.close(w)
        assert readable(high_r, 1)  # end of file counts, as select says
    finally:
        for fd in (r, high_r):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
