"""Arenas for the snapshot: the one the node config names, plus arena files that engine processes map.

Cheap by design (it runs on every refresh): header check only, mappers from maps without smaps.
"""

from __future__ import annotations

from pathlib import Path

from ops.errors import GpuwardenError
from ops.model import ArenaInfo
from ops.settings import Settings

from . import format as fmt
from .mappers import find_mappers, shared_files


def _config_arena(settings: Settings) -> str | None:
    try:
        from ops import nodeconfig
    except ImportError:
        return None
    if not settings.config_path.exists():
        return None
    try:
        cfg = nodeconfig.load(settings)
    except GpuwardenError:
        return None  # a broken config is reported by the commands that need it
    return cfg.arena.path if cfg.arena else None


def _engine_pids(settings: Settings) -> list[int]:
    try:
        from ops.engines.state import list_engines
        return [e.pid for e in list_engines(settings) if e.pid and e.phase not in ("exited", "crashed")]
    except (ImportError, GpuwardenError):
        return []


def _is_arena(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(fmt.MAGIC)) == fmt.MAGIC
    except OSError:
        return False


def list_arenas(settings: Settings) -> list[ArenaInfo]:
    paths: list[str] = []
    configured = _config_arena(settings)
    if configured:
        paths.append(configured)
    for pid in _engine_pids(settings):
        for path in sorted(shared_files(pid, settings.proc_root)):
            if path not in paths and _is_arena(path):
                paths.append(path)
    out = []
    for path in paths:
        state, header = fmt.header_state(path)
        size = header.payload_size if header else None
        mappers = tuple(find_mappers(path, settings.proc_root, with_usage=False, state_dir=settings.state_dir))
        out.append(ArenaInfo(path=str(Path(path)), size=size, header_state=state, mappers=mappers))
    return out
