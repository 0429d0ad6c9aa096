"""Small per-node facts kept in the state dir: drained GPUs and the idle VRAM baseline.

Both are JSON files replaced atomically; readers never see a half-written set.
"""

from __future__ import annotations

import time
from pathlib import Path

from typing import TYPE_CHECKING

from . import statedir

if TYPE_CHECKING:
    from .sampling.filecache import FileCache


def _read(path: Path, cache: "FileCache | None") -> dict:
    if cache is not None:
        return cache.json(path, default={}, kind=dict) or {}
    return statedir.read_json(path, default={}, kind=dict) or {}


def drained(state_dir: Path, cache: "FileCache | None" = None) -> dict[int, dict]:
    """GPU index -> {"since": ts, "who": ..., "reason": ...} for every drained GPU.

    `cache`: a sampler's FileCache, so that a refresh parses the file only when it changed."""
    data = _read(state_dir / statedir.DRAINED, cache)
    return {int(k): v for k, v in data.items()}


def set_drained(state_dir: Path, gpu: int, on: bool, who: str = "", reason: str = "") -> None:
    statedir.ensure(state_dir)
    data = {str(k): v for k, v in drained(state_dir).items()}
    if on:
        data[str(gpu)] = {"since": time.time(), "who": who, "reason": reason}
    else:
        data.pop(str(gpu), None)
    statedir.write_json(state_dir / statedir.DRAINED, data)


def baseline(state_dir: Path, cache: "FileCache | None" = None) -> dict[int, int]:
    """GPU index -> idle VRAM bytes recorded by `baseline record`."""
    data = _read(state_dir / statedir.BASELINE, cache)
    return {int(k): int(v["vram_bytes"]) for k, v in data.get("gpus", {}).items()}


def set_baseline(state_dir: Path, values: dict[int, int], backend: str) -> None:
    statedir.ensure(state_dir)
    data = statedir.read_json(state_dir / statedir.BASELINE, default={}) or {}
    gpus = data.get("gpus", {})
    now = time.time()
    for gpu, value in values.items():
        gpus[str(gpu)] = {"vram_bytes": int(value), "recorded_at": now, "backend": backend}
    statedir.write_json(state_dir / statedir.BASELINE, {"gpus": gpus})
