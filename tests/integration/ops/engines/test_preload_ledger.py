"""The KFD ledger: the interposer records every pinned host allocation and free, however the engine reaches the call.

Unmodified engines (tests/standins/preload/pinned.c) run the real libgwpreload.so against stand-in runtimes that
implement hipHostMalloc & co, cudaHostAlloc & co and cuMemHostAlloc & co (standin_common.h); a stand-in's
STANDIN_PINNED_LIMIT makes allocations past it fail with 2 (hipErrorOutOfMemory), as KFD's limit does.
"""

from __future__ import annotations

import json
import signal

import pytest

from engines.harness import records, supervised  # noqa: F401
from engines.preload_harness import Engine, events, preload_env
from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.engines.ledger import HostLedgerLog
from gpuwarden.ops.foundation.status_protocol import StatusEvent
from helpers.simnode import wait_for

SIZE = 2 << 20  # above the default 1 MiB ledger threshold: one line per call
MiB = 1 << 20

# mode -> (the calls it allocates with, the free calls, how the interposer got in the way)
PATHS = {
    "linked": (["hipHostMalloc", "hipHostAlloc", "hipExtHostAlloc", "hipMallocHost", "hipMemAllocHost"],
               {"hipHostFree", "hipFreeHost"}, "symbol"),
    "dlsym": (["hipHostMalloc", "hipHostAlloc", "hipExtHostAlloc", "hipMallocHost", "hipMemAllocHost"],
              {"hipHostFree", "hipFreeHost"}, "dlsym"),
    # dlvsym(handle, name, "hip_4.2"), as ROCm's libamdhip64 versions its symbols; our hook reports it as dlsym
    "dlvsym": (["hipHostMalloc", "hipHostAlloc", "hipExtHostAlloc", "hipMallocHost", "hipMemAllocHost"],
               {"hipHostFree", "hipFreeHost"}, "dlsym"),
    "hipproc": (["hipHostMalloc"], {"hipHostFree"}, "procaddress"),
    "cuproc": (["cuMemHostAlloc", "cuMemAllocHost"], {"cuMemFreeHost"}, "procaddress"),
    "driver": (["cuMemHostAlloc", "cuMemAllocHost", "cuMemAllocHost_v2"], {"cuMemFreeHost"}, "dlsym"),
    # the runtime reaches the driver's cuMemHostAlloc inside: one line per engine call, not two
    "cudart": (["cudaHostAlloc", "cudaMallocHost"], {"cudaFreeHost"}, "dlsym"),
    "deepbind": (["hipHostMalloc"], {"hipHostFree"}, "deepbind"),
}


def pinned_argv(standins, mode: str, size: int = SIZE) -> list[str]:
    return [str(standins / ("pinned_linked" if mode == "linked" else "pinned")), mode, str(size)]


def run_pinned(standins, tmp_path, mode: str, size: int = SIZE, **env: str) -> Engine:
    engine = Engine(pinned_argv(standins, mode, size), {**preload_env(tmp_path, gate=False), **env}, tmp_path)
    engine.proc.wait(20)
    return engine


def ledger_events(work, pid=None):
    return [e for e in events(work, pid) if e.phase.startswith("host-")]


@pytest.mark.parametrize("mode", list(PATHS))
def test_every_path_records_each_allocation_and_free(mode, standins, tmp_path):
    engine = run_pinned(standins, tmp_path, mode)
    assert engine.proc.returncode == 0, engine.output
    allocs, frees, via = PATHS[mode]
    got = ledger_events(tmp_path, engine.proc.pid)
    made = [e for e in got if e.phase == "host-alloc"]
    freed = [e for e in got if e.phase == "host-free"]
    assert [e.data["call"] for e in made] == allocs, [e.data for e in got]
    assert {e.data["call"] for e in freed} == frees and len(freed) == len(allocs)
    assert all(e.data["via"] == via for e in got)
    for e in made:
        assert e.data["bytes"] == SIZE and e.data["result"] == 0 and e.data["seconds"] >= 0
        # the calls with flags pass them through as given (Portable | Mapped); the others have none
        assert e.data["flags"] == (None if "MallocHost" in e.data["call"] or "AllocHost" in e.data["call"] else 3)
    # The running totals: up by each allocation, back to zero after the frees, the peak kept.
    assert [e.data["pinned_bytes"] for e in made] == [SIZE * (i + 1) for i in range(len(allocs))]
    last = got[-1].data
    assert last["pinned_bytes"] == 0 and last["pinned_count"] == 0 and last["peak_bytes"] == SIZE * len(allocs)
    assert last["allocs"] == last["frees"] == len(allocs) and last["failed"] == 0
    # Each free is matched to its allocation's bytes (the calls take only the pointer).
    assert {e.data["ptr"] for e in freed} == {e.data["ptr"] for e in made}
    assert all(e.data["bytes"] == SIZE for e in freed)


def test_a_failed_allocation_is_on_record_before_the_engine_crashes(standins, tmp_path):
    # The incident's sequence: the registration succeeds, the next pinned allocation fails, the engine
    # dereferences what it did not get. The failed call's line must be written before the call returns.
    engine = run_pinned(standins, tmp_path, "linked", STANDIN_PINNED_LIMIT=str(SIZE + SIZE // 2), PINNED_CRASH="1",
                        PINNED_REGISTER=str(512 * MiB), STANDIN_REGISTER_MS="0")
    assert engine.proc.returncode == -signal.SIGSEGV, engine.output
    got = ledger_events(tmp_path, engine.proc.pid)
    assert [e.phase for e in got] == ["host-alloc"] + ["host-alloc-failed"] * 4, [e.data for e in got]
    failed = got[1].data
    assert failed["call"] == "hipHostAlloc" and failed["bytes"] == SIZE and failed["flags"] == 3
    assert failed["result"] == 2 and failed["ptr"] in ("(nil)", "0x0")
    assert failed["pinned_bytes"] == SIZE and failed["failed"] == 1
    assert got[-1].data["failed"] == 4
    # The registration before it is on record too: both draw on the one KFD limit.
    assert [e.phase for e in events(tmp_path, engine.proc.pid) if "regist" in e.phase] == ["registering", "registered"]


def test_small_calls_move_only_the_totals_and_are_written_at_exit(standins, tmp_path):
    small = 64 << 10
    engine = run_pinned(standins, tmp_path, "linked", size=small)
    assert engine.proc.returncode == 0, engine.output
    got = ledger_events(tmp_path, engine.proc.pid)
    assert not [e for e in got if e.phase in ("host-alloc", "host-free")]
    assert got, "the totals were not written when the engine exited"
    last = got[-1]
    assert last.phase == "host-ledger"
    assert last.data["allocs"] == 5 and last.data["frees"] == 5 and last.data["peak_bytes"] == 5 * small
    assert last.data["pinned_bytes"] == 0


def test_the_threshold_comes_from_the_environment(standins, tmp_path):
    engine = run_pinned(standins, tmp_path, "cudart", size=4096, GPUWARDEN_LEDGER_THRESHOLD="0")
    assert engine.proc.returncode == 0, engine.output
    got = ledger_events(tmp_path, engine.proc.pid)
    assert [e.phase for e in got] == ["host-alloc", "host-alloc", "host-free", "host-free"]


def test_a_free_of_a_pointer_nobody_allocated_is_a_failed_call(standins, tmp_path):
    engine = run_pinned(standins, tmp_path, "dlsym", PINNED_BAD_FREE="1")
    assert "bad free returned 1" in engine.output
    bad = ledger_events(tmp_path, engine.proc.pid)[-1]
    assert bad.phase == "host-free-failed" and bad.data["call"] == "hipHostFree" and bad.data["result"] == 1
    assert bad.data["bytes"] == 0 and bad.data["pinned_bytes"] == 0 and bad.data["failed"] == 1


def test_the_ledger_sums_an_engines_processes_and_keeps_failures_across_restarts():
    log = HostLedgerLog()
    log.new_run(100.0)

    def ev(phase, pid, ts, **data):
        return StatusEvent(phase, ts, {"pid": pid, "source": "preload", **data})
    log.on_event(ev("host-alloc", 10, 101.0, call="hipHostMalloc", bytes=4 * MiB, pinned_bytes=4 * MiB,
                    peak_bytes=4 * MiB, allocs=1))
    log.on_event(ev("host-ledger", 11, 102.0, pinned_bytes=MiB, peak_bytes=2 * MiB, allocs=3, frees=2))
    got = log.on_event(ev("host-alloc-failed", 11, 103.0, call="hipHostMalloc", bytes=8 << 30, flags=0, result=2,
                          pinned_bytes=MiB, peak_bytes=2 * MiB, allocs=3, frees=2, failed=1))
    assert got is not None and got["result"] == 2 and got["pid"] == 11 and got["bytes"] == 8 << 30
    rec = log.record
    assert rec["pinned_bytes"] == 5 * MiB and rec["peak_bytes"] == 6 * MiB and rec["failed"] == 1
    assert rec["allocs"] == 4 and sorted(rec["processes"]) == ["10", "11"]
    assert log.on_event(ev("registered", 10, 104.0)) is None
    log.new_run(200.0)
    assert log.record["pinned_bytes"] == 0 and log.record["processes"] == {}
    assert [f["call"] for f in log.record["failures"]] == ["hipHostMalloc"]


def test_launch_engines_list_status_and_metrics_show_the_ledger(standins, supervised, cli, tmp_path):
    # An engine registers 512 MiB, allocates pinned memory until its runtime refuses, and serves on.
    cfg = tmp_path / "node.toml"
    env = {"STANDIN_PINNED_LIMIT": str(3 * SIZE), "PINNED_REGISTER": str(512 * MiB), "STANDIN_REGISTER_MS": "0",
           "PINNED_SERVE": "1"}
    cfg.write_text("[stagger]\nslots = 1\nregistration_timeout = 30\n\n"
                   '[[engines]]\nname = "dp0"\ngpu = 0\nprogress = "preload"\nready_pattern = "^serving"\n'
                   f"argv = {json.dumps(pinned_argv(standins, 'linked'))}\n"
                   "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }\n")
    assert cli("sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    proc = cli("--config", str(cfg), "launch")
    assert "Traceback" not in proc.stdout + proc.stderr
    wait_for(lambda: (records(supervised).get("dp0", {}).get("host_ledger") or {}).get("failed") == 2, 20,
             "dp0's failed pinned calls on record")
    record = records(supervised)["dp0"]
    assert record["host_ledger"]["pinned_bytes"] == 3 * SIZE
    assert "hipMemAllocHost of 2.0 MiB returned hipErrorOutOfMemory (2)" in record["detail"], record["detail"]
    assert '"action": "engine-host-call-failed"' in (supervised / "journal.log").read_text()

    listed = json.loads(cli("engines", "list", "--json").stdout)
    jsondoc.validate(listed)
    [eng] = listed["engines"]
    ledger = eng["ledger"]
    assert ledger["registered_bytes"] == 512 * MiB and ledger["pinned_bytes"] == 3 * SIZE
    assert ledger["pinned_peak_bytes"] == 3 * SIZE and ledger["failed_calls"] == 2
    assert [(c["call"], c["bytes"], c["result"]) for c in ledger["last_failed_calls"]] == \
        [("hipMallocHost", SIZE, 2), ("hipMemAllocHost", SIZE, 2)]
    assert listed["kfd"]["source"] in ("debugfs", "computed") and listed["kfd"]["limit_bytes"] > 0

    table = cli("engines", "list").stdout
    assert "PINNED" in table and "6.0 MiB" in table, table
    assert "dp0: hipMemAllocHost of 2.0 MiB FAILED: hipErrorOutOfMemory (2)" in table, table
    assert "KFD system memory" in table and ("(debugfs" in table or "(computed;" in table), table
    assert "512.0 MiB registered + 6.0 MiB pinned" in table, table

    doc = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    jsondoc.validate(doc)
    # Compatible: inside the engine records, which snapshot/1 always left open; a reader's older schema still reads it.
    import jsonschema
    from helpers.paths import REPO
    jsonschema.validate(doc, json.loads((REPO / "tests/fixtures/schemas/snapshot.v1.before-deadlines.json").read_text()))
    [eng] = [e for e in doc["engines"] if e["name"] == "dp0"]
    assert eng["ledger"]["pinned_bytes"] == 3 * SIZE and eng["ledger"]["failed_calls"] == 2
    assert eng["host_ledger"]["failed"] == 2

    # /metrics, from the same document read back (as a bundle replay or `status` through the agent does)
    from gpuwarden.ops.metrics.families import _engine_families
    from gpuwarden.ops.metrics.reading import MetricsOptions
    from gpuwarden.ops.foundation.model import snapshot_from_dict
    snap = snapshot_from_dict(doc)
    fams = {f.name: f for f in _engine_families(snap, 0.0, MetricsOptions())}
    value = {name: [s.value for s in fams[name].samples] for name in fams}
    assert value["gpuwarden_engine_pinned_bytes"] == [3 * SIZE]
    assert value["gpuwarden_engine_pinned_peak_bytes"] == [3 * SIZE]
    assert value["gpuwarden_engine_failed_host_calls"] == [2]
    assert value["gpuwarden_engine_registered_bytes"] == [512 * MiB]


def test_the_tui_arena_panel_shows_each_engines_ledger():
    from gpuwarden.ops.foundation.model import snapshot_from_dict
    from gpuwarden.tui.widgets.arena import ArenaPanel
    from rich.text import Text
    GiB = 1 << 30
    engine = {"name": "dp2", "gpu": 2, "phase": "serving", "pid": 412, "stale": False,
              "registrations": [{"kind": "register", "call": "hipHostRegister", "bytes": 25 * GiB,
                                 "outcome": "registered", "started_at": 10.0, "seconds": 3.0, "result": 0, "pid": 412}],
              "host_ledger": {"pinned_bytes": 2 * GiB, "peak_bytes": 4 * GiB, "failed": 1, "processes": {"412": {}},
                              "failures": [{"kind": "alloc", "call": "hipHostMalloc", "bytes": 8 * GiB, "result": 2,
                                            "ts": 20.0, "flags": 0, "pid": 412, "via": "symbol"}]}}
    quiet = {"name": "dp3", "gpu": 3, "phase": "serving", "pid": 413, "stale": False}
    snap = snapshot_from_dict({"taken_at": 30.0, "hostname": "h", "backend": "sim", "simulated": True,
                               "engines": [engine, quiet]})
    t = Text()
    ArenaPanel()._ledger(t, snap)
    shown = t.plain
    assert "KFD ledger (registered + pinned)" in shown
    assert "dp2 GPU2 25.0 GiB + 2.0 GiB (peak 4.0 GiB)" in shown, shown
    assert "1 failed, last hipHostMalloc of 8.0 GiB: hipErrorOutOfMemory (2)" in shown, shown
    assert "dp3" not in shown  # nothing reported: no line


STRESS = r"""
import ctypes, os, random, sys, threading
lib = ctypes.CDLL(os.path.join(sys.argv[1], "libamdhip64.so"))
lib.hipHostMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
lib.hipHostFree.argtypes = [ctypes.c_void_p]
held = []  # many live at once: long probe chains in the interposer's pointer table, freed in random order
for i in range(6000):
    p = ctypes.c_void_p()
    assert lib.hipHostMalloc(ctypes.byref(p), 4096 + i % 7, 0) == 0
    held.append(p.value)
random.Random(1).shuffle(held)
for p in held:
    assert lib.hipHostFree(p) == 0

def churn(seed):
    rng, mine = random.Random(seed), []
    for _ in range(3000):
        if mine and rng.random() < 0.5:
            assert lib.hipHostFree(mine.pop(rng.randrange(len(mine)))) == 0
        else:
            p = ctypes.c_void_p()
            assert lib.hipHostMalloc(ctypes.byref(p), 1000, 0) == 0
            mine.append(p.value)
    for p in mine:
        assert lib.hipHostFree(p) == 0
threads = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
for t in threads: t.start()
for t in threads: t.join()
kept = ctypes.c_void_p()
assert lib.hipHostMalloc(ctypes.byref(kept), 3 << 20, 0) == 0   # one line of its own, still live at the fork
child = os.fork()
if child == 0:
    lib.hipHostFree(kept)   # the child's books start empty: a free of a pointer it never allocated
    os._exit(0)
os.waitpid(child, 0)
print("done", flush=True)
"""


@pytest.mark.parametrize("table", [None, 8192], ids=["as-shipped", "crowded-table"])
def test_the_books_balance_under_threads_many_live_pointers_and_a_fork(table, standins, tmp_path):
    # crowded-table: the interposer built with an 8192-slot pointer table, 6000 live in it: long probe chains,
    # so a free that broke a chain would lose the pointers after it (unknown_frees, pinned bytes never freed).
    import os
    import subprocess
    import sys
    from helpers.paths import REPO
    from gpuwarden.ops.engines import preload
    env = {**preload_env(tmp_path, gate=False), "STANDIN_REGISTER_MS": "0"}
    if table:
        lib = tmp_path / "libgwpreload-small.so"
        cc = os.environ.get("CC") or "cc"
        subprocess.run([cc, "-std=gnu11", "-O2", "-fvisibility=hidden", "-fPIC", "-shared", f"-DGW_LIVE_CAP={table}",
                        f"-I{REPO / 'native'}", "-o", str(lib), *map(str, sorted((REPO / "native").glob("*.c"))),
                        "-ldl", "-lpthread"], check=True)
        env["LD_PRELOAD"] = env["LD_PRELOAD"].replace(str(preload.LIBRARY), str(lib))
    done = subprocess.run([sys.executable, "-c", STRESS, str(standins)], env={**__import__("os").environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    parent = ledger_events(tmp_path, None)
    pids = {e.data["pid"] for e in parent}
    assert len(pids) == 2, pids
    last = {pid: [e for e in parent if e.data["pid"] == pid][-1].data for pid in pids}
    mine = next(v for v in last.values() if v["allocs"] > 1)
    theirs = next(v for v in last.values() if v["allocs"] == 0)
    # The parent: every small allocation freed, only the 3 MiB one live; nothing lost from the table.
    assert mine["pinned_bytes"] == 3 << 20 and mine["pinned_count"] == 1, mine
    assert mine["allocs"] == mine["frees"] + 1 and mine["untracked"] == 0 and mine["unknown_frees"] == 0, mine
    assert mine["peak_bytes"] >= sum(4096 + i % 7 for i in range(6000))
    # The child freed what its parent allocated: it says so, and charges itself nothing.
    assert theirs["frees"] == 1 and theirs["unknown_frees"] == 1 and theirs["pinned_bytes"] == 0, theirs


# --- the node: KFD used/limit from debugfs, else computed, saying which -----------------------------------------
def test_the_computed_limit_is_the_drivers_arithmetic():
    from gpuwarden.ops.arena.budget import kfd_system_limit
    from gpuwarden.ops.node.debugfs.kfd_limit import computed_limit
    GiB = 1 << 30
    # The incident's node: 125 GiB visible -> about 121.5 GiB (issue 33).
    assert 121.5 * GiB < computed_limit(125 * GiB) < 121.6 * GiB
    assert computed_limit(2 * GiB) == (2 * GiB - (2 * GiB >> 6)) >> 1  # too little RAM for the reserve: halved
    for ram in (2 * GiB, 64 * GiB, 125 * GiB, 1536 * GiB):
        assert computed_limit(ram) == kfd_system_limit(ram)  # the budget's copy agrees


def test_without_debugfs_the_node_limit_is_computed_and_says_so(cli, state_dir, tmp_path):
    from gpuwarden.ops.arena.kfd_node import node_kfd
    from gpuwarden.ops.foundation.settings import Settings
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal:       131072000 kB\nMemFree:        1000 kB\n")
    kfd = node_kfd(Settings(state_dir=state_dir, proc_root=proc, sysfs_root=tmp_path / "sys", backend="sysfs"))
    assert kfd["source"] == "computed" and kfd["used_bytes"] is None
    assert kfd["limit_bytes"] == 131072000 * 1024 - (131072000 * 1024 >> 6) - (3 << 29)
    assert "amdgpu_amdkfd_gpuvm_init_mem_limits" in kfd["note"] and "debugfs" in kfd["note"]
    # status --json: the sim node with its kfd/mem_limit gone carries the computed limit in each GPU's driver books
    assert cli("sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    [books] = list((state_dir / "sim").rglob("kfd/mem_limit"))
    import shutil
    shutil.rmtree(books.parent)
    books.parent.write_text("")  # a file where the kfd directory was: the sim cannot write it, nobody can read it
    doc = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    jsondoc.validate(doc)
    driver = doc["gpus"][0]["driver"]
    assert driver["kfd_mem_limit"] is None and driver["kfd_mem_limit_unavailable"]
    assert driver["kfd_mem_limit_computed"]["system_limit"] > 0 and "RAM/64" in driver["kfd_mem_limit_computed"]["how"]
    listed = json.loads(cli("--backend", "sim", "engines", "list", "--json").stdout)
    jsondoc.validate(listed)
    assert listed["kfd"]["source"] == "computed" and listed["kfd"]["used_bytes"] is None
    assert listed["kfd"]["limit_bytes"] == driver["kfd_mem_limit_computed"]["system_limit"]
    from gpuwarden.ops.metrics.families import _driver_families
    from gpuwarden.ops.metrics.reading import MetricsOptions
    from gpuwarden.ops.foundation.model import snapshot_from_dict
    fams = {f.name: f for f in _driver_families(snapshot_from_dict(doc), MetricsOptions())}
    assert [s.value for s in fams["gpuwarden_kfd_system_mem_limit_computed_bytes"].samples] == \
        [driver["kfd_mem_limit_computed"]["system_limit"]]
    assert not fams["gpuwarden_kfd_system_mem_limit_bytes"].samples
