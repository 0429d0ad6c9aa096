"""Arenas for the snapshot: the one the node config names, plus arena files that engine processes map.

Cheap by design (it runs on every refresh): header check only, mappers from maps without smaps, and
the whole of /proc scanned at most every full_scan_s; in between only known mappers and engines are looked at.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import ArenaInfo, ArenaMapper, EngineInfo
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.engines.state import list_engines

from gpuwarden.ops.arena import format as fmt
from gpuwarden.ops.arena.mappers import find_mappers, shared_files

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Sequence

# An engine maps its arena once, at start: what a PID maps shared is read again only this often while the engine
# is young (its first SETTLING_S as we know it), then every SETTLED_SHARED_FILES_S. Each look reads the engine's
# whole /proc/<pid>/maps (thousands of lines for a serving engine): 32 engines every 15 s were the big sim node
# agent's largest periodic step after the deep scan. An arena mapped by an engine past its start is seen this late.
SHARED_FILES_S = 15.0
SETTLING_S = 120.0
SETTLED_SHARED_FILES_S = 60.0
# Reading /proc/<pid>/maps costs the kernel ~0.1 ms a process: thousands of them make a full scan
# take 100+ ms, too much for every refresh. New mappers are engines (seen at once) or show up within this.
FULL_SCAN_S = 15.0
# Between full scans the known mappers' maps are re-read at most this often (registered flags lag by that).
QUICK_S = 2.0


def _config_arena(settings: Settings) -> str | None:
    # only with a config file: status otherwise goes without nodeconfig (dataclasses, typing, tomllib)
    # deferred: keeps `gpuwarden status --json` with an engine running cheap (21.1 ms there)
    from gpuwarden.ops.config import nodeconfig
    if not settings.config_path.exists():
        return None
    try:
        cfg = nodeconfig.load(settings)
    except GpuwardenError:
        return None  # a broken config is reported by the commands that need it
    return cfg.arena.path if cfg.arena else None


def _engine_pids(settings: Settings, engines: Sequence[EngineInfo] | None = None) -> list[int]:
    try:
        if engines is None:
            engines = list_engines(settings)
        return [e.pid for e in engines if e.pid and e.phase not in ("exited", "crashed")]
    except GpuwardenError:
        return []


def _is_arena(path: str) -> bool:
    return fmt.has_magic(path)


class ArenaWatch:
    """What one sampler remembers between refreshes: shared files per engine, the last full and quick scans."""

    def __init__(self, settings: Settings, *, full_scan_s: float = FULL_SCAN_S, quick_s: float = QUICK_S,
                 shared_files_s: float = SHARED_FILES_S):
        self.settings = settings
        self.full_scan_s = full_scan_s
        self.quick_s = quick_s
        self.shared_files_s = shared_files_s
        self.settled_shared_files_s = max(shared_files_s, SETTLED_SHARED_FILES_S)
        self._shared: dict[int, tuple[float, set[str]]] = {}  # pid -> (when read, its shared files)
        self._first_seen: dict[int, float] = {}  # pid -> when this watch first read its shared files
        self._scans: dict[str, tuple[float, list[int]]] = {}  # arena path -> (when, mapper pids)
        # arena path -> (when, engines, mappers)
        self._quick: dict[str, tuple[float, tuple[int, ...], tuple[ArenaMapper, ...]]] = {}
        # shared file -> (its stamp, whether it starts like an arena): a stat a refresh instead of open, read and
        # close for each file an engine maps shared (32 engines: ~0.15 ms); a rewritten file is looked at again.
        self._magic: dict[str, tuple[tuple[int, int, int] | None, bool]] = {}

    def _is_arena(self, path: str) -> bool:
        try:
            st = os.stat(path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        hit = self._magic.get(path)
        if hit is None or hit[0] != stamp or stamp is None:
            hit = self._magic[path] = (stamp, _is_arena(path))
        return hit[1]

    def _shared_files(self, pid: int) -> set[str]:
        now = time.monotonic()
        hit = self._shared.get(pid)
        if hit is not None:
            young = now - self._first_seen[pid] < SETTLING_S
            if now - hit[0] <= (self.shared_files_s if young else self.settled_shared_files_s):
                return hit[1]
        else:
            self._first_seen[pid] = now
        hit = (now, shared_files(pid, self.settings.proc_root))
        self._shared[pid] = hit
        return hit[1]

    def _mappers(self, path: str, engines: list[int]) -> tuple[ArenaMapper, ...]:
        now = time.monotonic()
        quick = self._quick.get(path)
        if quick is not None and now - quick[0] < self.quick_s and quick[1] == tuple(sorted(engines)):
            return quick[2]
        settings = self.settings
        last = self._scans.get(path)
        if last is None or now - last[0] > self.full_scan_s:
            found = tuple(find_mappers(path, settings.proc_root, with_usage=False, state_dir=settings.state_dir))
            self._scans[path] = (now, [m.pid for m in found])
        else:
            pids = sorted(set(last[1]) | set(engines))
            found = tuple(find_mappers(path, settings.proc_root, with_usage=False, pids=pids,
                                       state_dir=settings.state_dir))
        self._quick[path] = (now, tuple(sorted(engines)), found)
        return found

    def arenas(self, engines: Sequence[EngineInfo] | None = None,
               configured: str | None | bool = True) -> list[ArenaInfo]:
        """`engines`: the EngineInfo list when the caller has it already (the snapshot does).
        `configured`: the config's arena path when the caller read the config already (None: no arena);
        True reads the config here."""
        paths: list[str] = []
        if configured is True:
            configured = _config_arena(self.settings)
        if configured:
            paths.append(str(configured))
        engine_pids = _engine_pids(self.settings, engines)
        live = set(engine_pids)
        for pid in [p for p in self._shared if p not in live]:
            del self._shared[pid]
            del self._first_seen[pid]
        asked: set[str] = set()
        for pid in engine_pids:
            shared = self._shared_files(pid)
            asked.update(shared)
            for path in sorted(shared):
                if path not in paths and self._is_arena(path):
                    paths.append(path)
        if len(self._magic) > len(asked):  # files no engine maps any more
            for gone in self._magic.keys() - asked:
                del self._magic[gone]
        for gone in [p for p in self._quick if p not in paths]:
            self._quick.pop(gone, None)
            self._scans.pop(gone, None)
        out = []
        for path in paths:
            state, header = fmt.header_state(path)
            size = header.payload_size if header else None
            out.append(ArenaInfo(path=str(Path(path)), size=size, header_state=state,
                                 mappers=self._mappers(path, engine_pids)))
        return out


def list_arenas(settings: Settings, engines: Sequence[EngineInfo] | None = None,
                watch: ArenaWatch | None = None) -> list[ArenaInfo]:
    """The node's arenas now; pass a sampler's ArenaWatch so that refreshes rescan /proc only now and then."""
    return (watch or ArenaWatch(settings)).arenas(engines)
