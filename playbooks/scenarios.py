"""Drills on the simulated node: set it up as the README's two incidents, or clean, in one command.

residual: a killed tenant left 14 GiB on GPU 2, a zombie holds 2 GiB on GPU 1. arena: the arena incident's
sequence: four canaries register one arena, every registration succeeds and the simulated KFD ledger ends near
its limit; each canary's next pinned allocation fails and it dies of SIGSEGV. clean: nothing running, nothing held.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from gpuwarden.ops.foundation import journal, statedir, statefiles
from gpuwarden.ops.node import procs, nodestate
from gpuwarden.ops.config import nodeconfig
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.paths import child_pythonpath
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.arena.create import create
from gpuwarden.ops.engines import control, state as st
from gpuwarden.ops.clean.reaper import Reaper
from gpuwarden.playbooks import framework
from gpuwarden.playbooks.launch import LaunchPlaybook

SCENARIOS = ("residual", "arena", "clean")
GIB = 1 << 30
RECORD = "scenario.json"  # in the sim dir: what a scenario started, so the next one can end it
ARENA_BYTES = 64 << 20
CANARIES = 4


def _record_path(node: SimNode) -> Path:
    return node.dir / RECORD


def _read_record(node: SimNode, say: Callable[[str], None]) -> dict:
    try:
        return statefiles.load(_record_path(node), statefiles.SCENARIO, default={}, root=node.state_dir) or {}
    except statedir.StateFileError as exc:  # clean must still get the node back to empty
        say(f"{exc.message}: what that scenario started is not ended (its processes are checked by start time)")
        return {}


def clean(settings: Settings, say: Callable[[str], None], *, gpus: int | None = None, vram: int | None = None) -> None:
    """End what an earlier scenario started (its engines, its process families), then a fresh sim node."""
    node = SimNode(settings.state_dir)
    record = _read_record(node, say) if node.exists else {}
    for name in record.get("engines", []):
        if st.read_state(settings.state_dir, name) or st.read_spec(settings.state_dir, name):
            result = control.stop(settings, name, timeout_s=2.0)
            say(f"engine {name}: {result.result}")
        shutil.rmtree(st.engine_dir(settings.state_dir, name), ignore_errors=True)
    reaper = Reaper(settings)
    # Its own processes only, checked by PID and start time like every signal gpuwarden sends; the
    # careless parent before its subreaper, which then reaps it and the zombie it leaves to it.
    for proc in reversed(record.get("processes", [])):
        if reaper.send(proc["pid"], proc["ticks"], signal.SIGKILL, role="scenario", target=proc["pid"],
                       why="sim scenario clean") == "sent":
            say(f"ended {proc['what']} pid {proc['pid']}")
            _wait(f"pid {proc['pid']} to be reaped", lambda pid=proc["pid"]: procs.state_of(pid) in ("gone", "zombie"))
        for orphan in proc.get("reaps", []):
            _wait(f"zombie pid {orphan} to be reaped", lambda orphan=orphan: procs.state_of(orphan) == "gone")
    for path in record.get("files", []):
        try:
            statedir.unlink(Path(path), root=settings.state_dir)
        except ValueError:
            pass  # not a file a scenario made: those all live in the state dir
    cfg = node.config() if node.exists else {}
    node.init(gpus=gpus or cfg.get("gpus", 4), vram=vram or cfg.get("vram", 24 * GIB), force=True)
    for g in list(nodestate.drained(settings.state_dir)):
        nodestate.set_drained(settings.state_dir, g, False)
    _write_record(node, {"name": "clean"})


def _write_record(node: SimNode, record: dict) -> None:
    statedir.write_json(_record_path(node), {**record, "ts": time.time()}, root=node.state_dir)


def _spawn(argv: list[str]) -> subprocess.Popen:
    """A detached helper process (own session): it outlives this command, as the drill needs."""
    env = child_pythonpath(dict(os.environ))
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=env, cwd="/", text=True)


def _holding(node: SimNode, pid: int) -> bool:
    return any(a["pid"] == pid for a in node.describe()["allocations"])


def _wait(what: str, predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise GpuwardenError(f"sim scenario: {what} did not happen within {timeout_s:g}s",
                                 "the machine may be very busy: run the scenario again")
        time.sleep(0.05)


def residual(settings: Settings, say: Callable[[str], None]) -> None:
    clean(settings, say)
    node = SimNode(settings.state_dir)
    started: list[dict] = []
    # 1. A tenant killed while the driver leaks its memory: 14 GiB that no process owns on GPU 2.
    node.set_fault("leak-on-kill", True)
    tenant = _spawn([sys.executable, "-m", "gpuwarden.ops.node.sim.tenant", str(settings.state_dir), "2", str(14 * GIB)])
    assert tenant.stdout is not None
    tenant.stdout.readline()
    tenant.kill()
    tenant.wait()
    node.sync()
    node.set_fault("leak-on-kill", False)
    say("GPU 2: a tenant holding 14 GiB was killed; the driver kept its memory (an ownerless leak)")
    # 2. A worker killed under a parent that never reaps it: a zombie that keeps 2 GiB on GPU 1.
    keeper = _spawn([sys.executable, "-m", "gpuwarden.ops.node.sim.family", str(settings.state_dir), "1", str(2 * GIB)])
    assert keeper.stdout is not None
    parent, child = (int(x) for x in keeper.stdout.readline().split())
    keeper.stdout.close()
    for pid, what, reaps in ((keeper.pid, "subreaper of the zombie's family", []),
                             (parent, "careless parent", [child])):
        ticks = procs.identity(pid)
        if ticks is not None:
            started.append({"pid": pid, "ticks": ticks, "what": what, "reaps": reaps})
    _wait("the worker holding VRAM", lambda: _holding(node, child))
    os.kill(child, signal.SIGKILL)
    _wait("the worker to become a zombie", lambda: procs.state_of(child) == "zombie")
    say(f"GPU 1: worker pid {child} was killed; its parent pid {parent} never reaps it: a zombie holding 2 GiB")
    _write_record(node, {"name": "residual", "processes": started})
    journal.write(settings.state_dir, "sim-scenario", "ok", scenario="residual", zombie=child, parent=parent)


def arena(settings: Settings, say: Callable[[str], None]) -> dict:
    """The arena incident through the real launch playbook: four canaries register (all succeed), then each one's
    next allocation, a pinned host buffer, crosses the simulated KFD limit and the canary dies of SIGSEGV."""
    clean(settings, say)
    node = SimNode(settings.state_dir)
    path = node.dir / "scenario.arena"
    create(path, size=ARENA_BYTES, force=True)
    config = node.dir / "scenario-arena.toml"
    # Room for every registration (charged once per process) and 1/8 arena more; each pins 1/4 arena next.
    limit = CANARIES * ARENA_BYTES + ARENA_BYTES // 8
    canary = [sys.executable, "-m", "gpuwarden.ops.canary", "--arena", str(path), "--gpu", "0", "--runtime", "sim",
              "--pin", f"{ARENA_BYTES // 4}B", "--pin-after-peers", str(CANARIES)]
    lines = [f"# written by `gpuwarden sim scenario arena`: {CANARIES} canaries share one arena; every registration",
             "# succeeds, then each canary's next pinned allocation crosses the simulated KFD limit and it dies of",
             "# SIGSEGV, as the engines of the README's first incident did.",
             "", "[arena]", f"path = {json.dumps(str(path))}", f'size = "{ARENA_BYTES >> 20}MiB"', "",
             "[stagger]", "slots = 1", "registration_timeout = 60", "",
             "[defaults]", 'progress = "status"', "stop_grace = 5", 'restart = "no"',
             f'pinned_headroom = "{ARENA_BYTES // 4}B"', ""]
    names = [f"canary{i}" for i in range(CANARIES)]
    for i, name in enumerate(names):
        lines += ["[[engines]]", f'name = "{name}"', f"gpu = {i}", f"argv = {json.dumps(canary)}",
                  f'env = {{ GPUWARDEN_SIM_KFD_LIMIT = "{limit}B" }}', ""]
    statedir.atomic_write(config, "\n".join(lines), root=settings.state_dir)
    node.set_kfd_limit(limit)  # the simulated debugfs kfd/mem_limit shows the limit the canaries are held to
    _write_record(node, {"name": "arena", "engines": names, "files": [str(path)], "config": str(config)})
    cfg = nodeconfig.load(settings.with_(config_path=config))
    say(f"simulated KFD limit {limit >> 20} MiB: {CANARIES} registrations of {ARENA_BYTES >> 20} MiB fit, "
        f"leaving {(limit - CANARIES * ARENA_BYTES) >> 20} MiB; each canary then pins {ARENA_BYTES >> 22} MiB")
    # One after the other, so every canary serves before the last one registers; then they all allocate.
    result = framework.run(LaunchPlaybook(config=cfg, engines=cfg.engines, stagger=1, sequential=True),
                 settings.with_(config_path=config),
                 assume_yes=True, sink=lambda e: say(e.message) if e.kind == "info" and "engine" in e.data
                 and "phase" in e.data else None)
    if not result.ok and not (result.data.get("crashed") or {}).get("engine"):
        raise GpuwardenError("sim scenario arena: the launch failed before the canaries were up",
                             "see `gpuwarden engines list` and `gpuwarden journal`")
    # The launch may end with every canary serving (on a busy machine the pinned allocations come after it): the
    # crashes are waited for here, not taken from the launch's result.
    records: dict[str, dict] = {}
    first_crash: list[float] = []

    def settled() -> bool:
        # Every canary ended, or some did and the rest had 10 s more: a dead canary's charges are freed (KFD
        # releases a process's memory when it exits), so one that pins after a peer died may fit and serve on.
        records.update({n: st.read_state(settings.state_dir, n) or {} for n in names})
        ended = [r for r in records.values() if r.get("phase") in ("crashed", "exited")]
        if ended and not first_crash:
            first_crash.append(time.monotonic())
        return len(ended) == len(names) or bool(first_crash and time.monotonic() - first_crash[0] > 10)
    _wait("a canary to crash", settled, timeout_s=60.0)  # each waits up to 30 s for its peers, then pins
    if not any(records[n].get("signal") for n in names):
        raise GpuwardenError("sim scenario arena: expected the canaries to crash after registering, got no crash",
                             "see `gpuwarden engines list`")
    registered = [n for n in names if records[n].get("registrations") or records[n].get("registered_at")
                  or records[n].get("died_while") not in (None, "registering", "starting", "mapping", "verifying")]
    def fate(n: str) -> str:
        r = records[n]
        if r.get("phase") not in ("crashed", "exited"):
            return f"{n} still serves (its allocation fit once a dead peer's charges were freed)"
        return f"{n} died by {r.get('signal') or 'exit ' + str(r.get('exit_code'))} while {r.get('died_while') or '?'}"
    say(f"{', '.join(registered)} registered; then their pinned allocations crossed the limit: "
        + ", ".join(fate(n) for n in names))
    journal.write(settings.state_dir, "sim-scenario", "ok", scenario="arena", config=str(config))
    return {"config": str(config), "arena": str(path)}
