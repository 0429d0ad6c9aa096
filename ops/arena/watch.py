"""Arenas for the snapshot: the one the node config names, plus arena files that engine processes map.

Cheap by design (it runs on every refresh): header check only, mappers from maps without smaps, and
the whole of /proc scanned at most every FULL_SCAN_S; in between only known mappers and engines are looked at.
"""

from __future__ import annotations

from pathlib import Path

import time

from ops.errors import GpuwardenError
from ops.model import ArenaInfo
from ops.settings import Settings

from . import format as fmt
from .mappers import find_mappers, shared_files


def _config_arena(settings: Settings) -> str | None:
    from ops import nodeconfig
    if not settings.config_path.exists():
        return None
    try:
        cfg = nodeconfig.load(settings)
    except GpuwardenError:
        return None  # a broken config is reported by the commands that need it
    return cfg.arena.path if cfg.arena else None


def _engine_pids(settings: Settings, engines=None) -> list[int]:
    try:
        if engines is None:
            from ops.engines.state import list_engines
            engines = list_engines(settings)
        return [e.pid for e in engines if e.pid and e.phase not in ("exited", "crashed")]
    except GpuwardenError:
        return []


# An engine maps its arena once, at start: what a PID maps shared is read again only this often.
SHARED_FILES_S = 15.0
_shared: dict[tuple[str, int], tuple[float, set[str]]] = {}


def _shared_files_cached(pid: int, proc_root: Path) -> set[str]:
    key = (str(proc_root), pid)
    now = time.monotonic()
    hit = _shared.get(key)
    if hit is None or now - hit[0] > SHARED_FILES_S:
        hit = (now, shared_files(pid, proc_root))
        _shared[key] = hit
    return hit[1]


def _is_arena(path: str) -> bool:
    return fmt.has_magic(path)


# Reading /proc/<pid>/maps costs the kernel ~0.1 ms a process: thousands of them make a full scan
# take 100+ ms, too much for every refresh. New mappers are engines (seen at once) or show up within this.
FULL_SCAN_S = 15.0
_scans: dict[tuple[str, str], tuple[float, list[int]]] = {}


# Between full scans the known mappers' maps are re-read at most this often (registered flags lag by that).
QUICK_S = 2.0
_quick: dict[tuple[str, str], tuple[float, tuple[int, ...], tuple]] = {}


def _mappers(settings: Settings, path: str, engines: list[int]) -> tuple:
    key = (str(settings.proc_root), path)
    now = time.monotonic()
    quick = _quick.get(key)
    if quick is not None and now - quick[0] < QUICK_S and quick[1] == tuple(sorted(engines)):
        return quick[2]
    result = _mappers_now(settings, path, engines, key, now)
    _quick[key] = (now, tuple(sorted(engines)), result)
    return result


def _mappers_now(settings: Settings, path: str, engines: list[int], key, now: float) -> tuple:
    last = _scans.get(key)
    if last is None or now - last[0] > FULL_SCAN_S:
        found = find_mappers(path, settings.proc_root, with_usage=False, state_dir=settings.state_dir)
        _scans[key] = (now, [m.pid for m in found])
        return tuple(found)
    pids = sorted(set(last[1]) | set(engines))
    return tuple(find_mappers(path, settings.proc_root, with_usage=False, pids=pids, state_dir=settings.state_dir))


def list_arenas(settings: Settings, engines=None) -> list[ArenaInfo]:
    """`engines`: the EngineInfo list when the caller has it already (the snapshot does)."""
    paths: list[str] = []
    configured = _config_arena(settings)
    if configured:
        paths.append(configured)
    engines = _engine_pids(settings, engines)
    live = set(engines)
    for key in [k for k in _shared if k[1] not in live]:
        del _shared[key]
    for pid in engines:
        for path in sorted(_shared_files_cached(pid, settings.proc_root)):
            if path not in paths and _is_arena(path):
                paths.append(path)
    out = []
    for path in paths:
        state, header = fmt.header_state(path)
        size = header.payload_size if header else None
        mappers = _mappers(settings, path, engines)
        out.append(ArenaInfo(path=str(Path(path)), size=size, header_state=state, mappers=mappers))
    return out
