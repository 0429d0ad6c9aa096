"""ArenaWatch reads an engine's /proc/<pid>/maps every SHARED_FILES_S while the engine is young, then every
SETTLED_SHARED_FILES_S; the mappings are this test process's own, so /proc/<pid>/maps is the kernel's."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from gpuwarden.ops.arena import watch
from gpuwarden.ops.foundation.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def mapper(tmp_path):
    """map(name): this process maps a new file shared, and the file's path."""
    held: list[tuple[object, mmap.mmap]] = []

    def map_file(name: str) -> str:
        path = tmp_path / name
        path.write_bytes(b"\0" * mmap.PAGESIZE)
        f = open(path, "r+b")
        held.append((f, mmap.mmap(f.fileno(), mmap.PAGESIZE, mmap.MAP_SHARED)))
        return str(path)

    yield map_file
    for f, m in held:
        m.close()
        f.close()  # type: ignore[attr-defined]


def mine(w: watch.ArenaWatch, tmp_path: Path) -> set[str]:
    return {p for p in w._shared_files(os.getpid()) if p.startswith(str(tmp_path))}


def test_a_settled_engine_is_looked_at_less_often_and_a_late_mapping_is_seen_that_late(state_dir, tmp_path,
                                                                                        monkeypatch, mapper):
    clock = Clock()
    monkeypatch.setattr(watch, "time", clock)
    w = watch.ArenaWatch(Settings(state_dir=state_dir))
    first = mapper("first")
    assert mine(w, tmp_path) == {first}
    clock.now += watch.SETTLING_S + 1  # settled now; its last look was longer ago than either interval
    assert mine(w, tmp_path) == {first}
    second = mapper("second")
    clock.now += watch.SHARED_FILES_S + 1  # a young engine would be looked at again by now
    assert mine(w, tmp_path) == {first}
    clock.now += watch.SETTLED_SHARED_FILES_S - watch.SHARED_FILES_S
    assert mine(w, tmp_path) == {first, second}


def test_a_young_engine_is_looked_at_every_shared_files_s(state_dir, tmp_path, monkeypatch, mapper):
    clock = Clock()
    monkeypatch.setattr(watch, "time", clock)
    w = watch.ArenaWatch(Settings(state_dir=state_dir))
    assert mine(w, tmp_path) == set()
    late = mapper("late")
    assert mine(w, tmp_path) == set()  # within SHARED_FILES_S: the last look stands
    clock.now += watch.SHARED_FILES_S + 1
    assert mine(w, tmp_path) == {late}
