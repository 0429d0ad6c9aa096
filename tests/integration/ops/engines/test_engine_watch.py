"""The engine list a refresh reuses (ops/engines/watch.py): the same list while nothing it was made of changed,
and each change (a log line, a rewritten record, a shim's death, an engine added or removed) in the next one."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from gpuwarden.ops.engines import state
from gpuwarden.ops.engines.watch import EngineWatch
from gpuwarden.ops.foundation.filecache import FileCache
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.procs import identity


def _write_engine(state_dir, name: str, shim: subprocess.Popen, phase: str = "serving") -> None:
    d = state_dir / "engines" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "spec.json").write_text(json.dumps({"engine": {"name": name, "argv": ["x"], "gpu": 0}}))
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps({
        "name": name, "gpu": 0, "phase": phase, "shim_pid": shim.pid, "shim_start": identity(shim.pid),
        "pid": shim.pid, "pid_start": identity(shim.pid), "started_at": time.time(), "restarts": 0}))
    tmp.rename(d / "state.json")  # as the shim writes it: atomically
    with open(d / "engine.log", "a") as f:
        f.write("starting\n")


class Lister:
    """An EngineWatch as NodeExtras drives it (its FileCache swept after each refresh), counting full listings."""

    def __init__(self, settings: Settings, monkeypatch):
        self.watch = EngineWatch(settings)
        self.cache = FileCache()
        self.memo: dict = {}
        self.full = 0
        real = state.list_engines

        def counting(*a, **k):
            self.full += 1
            return real(*a, **k)
        monkeypatch.setattr(state, "list_engines", counting)
        self.real = real
        self.settings = settings

    def refresh(self):
        out = self.watch.engines(self.cache, self.memo)
        self.cache.sweep(self.watch.files())
        return out

    def truth(self):
        return tuple(self.real(self.settings))


@pytest.fixture
def shims():
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_an_unchanged_node_gets_the_same_list_without_reading_it_again(state_dir, shims, monkeypatch):
    settings = Settings(state_dir=state_dir)
    for i, p in enumerate(shims[:2]):
        _write_engine(state_dir, f"e{i}", p)
    lister = Lister(settings, monkeypatch)
    first = lister.refresh()
    if lister.watch._pids is None:
        pytest.skip("pidfds do not work here: every refresh lists in full")
    assert [e.name for e in first] == ["e0", "e1"] and first == lister.truth()
    for _ in range(5):
        assert lister.refresh() is first
    assert lister.full == 1
    assert len(lister.cache) == 6  # the records and logs stay cached though not read: a change re-reads one


def test_each_change_shows_in_the_next_refresh(state_dir, shims, monkeypatch):
    settings = Settings(state_dir=state_dir)
    for i, p in enumerate(shims[:2]):
        _write_engine(state_dir, f"e{i}", p)
    lister = Lister(settings, monkeypatch)
    lister.refresh()
    lister.refresh()
    # a log line
    with open(state_dir / "engines" / "e0" / "engine.log", "a") as f:
        f.write("serving on :8000\n")
    got = lister.refresh()
    assert got[0].last_log_line == "serving on :8000" and got == lister.truth()
    # a record rewritten by its shim
    _write_engine(state_dir, "e1", shims[1], phase="draining")
    got = lister.refresh()
    assert got[1].phase == "draining" and got == lister.truth()
    # an engine added, then one removed
    _write_engine(state_dir, "e2", shims[2])
    got = lister.refresh()
    assert [e.name for e in got] == ["e0", "e1", "e2"] and got == lister.truth()
    for f in (state_dir / "engines" / "e2").iterdir():
        f.unlink()
    (state_dir / "engines" / "e2").rmdir()
    got = lister.refresh()
    assert [e.name for e in got] == ["e0", "e1"] and got == lister.truth()
    # a shim's death: nothing on disk changes, its pidfd does
    shims[0].kill()
    shims[0].wait()
    got = lister.refresh()
    assert got[0].stale and got[0].phase == "stale" and got == lister.truth()
    assert lister.refresh() is got or lister.watch._pids is None


def test_a_shim_that_dies_unreaped_is_stale_at_the_next_refresh(state_dir, monkeypatch):
    """A zombie shim (its parent has not waited for it yet) is gone for the record, as engines.state.alive says."""
    settings = Settings(state_dir=state_dir)
    shim = subprocess.Popen(["sleep", "60"])
    try:
        _write_engine(state_dir, "e0", shim)
        lister = Lister(settings, monkeypatch)
        assert not lister.refresh()[0].stale
        assert not lister.refresh()[0].stale
        os.kill(shim.pid, 9)
        deadline = time.monotonic() + 10
        while state.alive(shim.pid, identity(shim.pid) or -1) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the kernel has made it a zombie
        with open(f"/proc/{shim.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
        assert lister.refresh()[0].stale
    finally:
        shim.kill()
        shim.wait()


def test_without_pidfds_every_refresh_lists_in_full(state_dir, shims, monkeypatch):
    settings = Settings(state_dir=state_dir)
    _write_engine(state_dir, "e0", shims[0])
    lister = Lister(settings, monkeypatch)
    lister.watch._pids = None  # as where pidfd_open is refused
    for _ in range(3):
        lister.refresh()
    assert lister.full == 3
