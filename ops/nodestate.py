"""Small per-node facts kept in the state dir: drained GPUs and the idle VRAM baseline.

Both are JSON files replaced atomically; readers never see a half-written set.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import statedir


def drained(state_dir: Path) -> dict[int, dict]:
    """GPU index -> {"since": ts, "who": ..., "reason": ...} for every drained GPU."""
    data = statedir.read_json_cached(state_dir / statedir.DRAINED, default={}) or {}
    return {int(k): v for k, v in data.items()}


def set_drained(state_dir: Path, gpu: int, on: bool, who: str = "", reason: str = "") -> None:
    statedir.ensure(state_dir)
    data = {str(k): v for k, v in drained(state_dir).items()}
    if on:
        data[str(gpu)] = {"since": time.time(), "who": who, "reason": reason}
    else:
        data.pop(str(gpu), None)
    statedir.write_json(state_dir / statedir.DRAINED, data)


def baseline(state_dir: Path) -> dict[int, int]:
    """GPU index -> idle VRAM bytes recorded by `baseline record`."""
    data = statedir.read_json_cached(state_dir / statedir.BASELINE, default={}) or {}
    return {int(k): int(v["vram_bytes"]) for k, v in data.get("gpus", {}).items()}


def set_baseline(state_dir: Path, values: dict[int, int], backend: str) -> None:
    statedir.ensure(state_dir)
    data = statedir.read_json(state_dir / statedir.BASELINE, default={}) or {}
    gpus = data.get("gpus", {})
    now = time.time()
    for gpu, value in values.items():
        gpus[str(gpu)] = {"vram_bytes": int(value), "recorded_at": now, "backend": backend}
    statedir.write_json(state_dir / statedir.BASELINE, {"gpus": gpus})
