"""Small per-node facts kept in the state dir: drained GPUs and the idle VRAM baseline.

Both are JSON files replaced atomically and read through the validating loader (gpuwarden.ops.foundation.statefiles).
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuwarden.ops.foundation import statedir, statefiles
from gpuwarden.ops.foundation.statedir import StateFileError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.ops.foundation.filecache import FileCache


def drained(state_dir: Path, cache: "FileCache | None" = None) -> dict[int, dict[str, Any]]:
    """GPU index -> {"since": ts, "who": ..., "reason": ...} for every drained GPU.

    A corrupt file raises StateFileError: launch and reset must not guess which GPUs are out of service.
    `cache`: a sampler's FileCache, so that a refresh parses the file only when it changed."""
    data = statefiles.load_cached(state_dir / statedir.DRAINED, statefiles.DRAINED, {}, root=state_dir, cache=cache)
    return {int(k): v for k, v in data.items()}


def drained_or_warning(state_dir: Path, cache: "FileCache | None" = None) -> tuple[dict[int, dict[str, Any]], str | None]:
    """drained(), or ({}, why) when the file is corrupt: for views that must still show the node."""
    try:
        return drained(state_dir, cache), None
    except StateFileError as exc:
        return {}, f"drained GPUs unknown: {exc.message} ({exc.hint})"


def set_drained(state_dir: Path, gpu: int, on: bool, who: str = "", reason: str = "") -> None:
    data = {str(k): v for k, v in drained(state_dir).items()}
    if on:
        data[str(gpu)] = {"since": time.time(), "who": who, "reason": reason}
    else:
        data.pop(str(gpu), None)
    statedir.write_json(state_dir / statedir.DRAINED, data, root=state_dir)


def baseline_or_warning(state_dir: Path, cache: "FileCache | None" = None) -> tuple[dict[int, int], str | None]:
    """GPU index -> idle VRAM bytes recorded by `baseline record`; a corrupt file is no baseline, with why."""
    try:
        data = statefiles.load_cached(state_dir / statedir.BASELINE, statefiles.BASELINE, {"gpus": {}},
                                      root=state_dir, cache=cache)
    except StateFileError as exc:
        return {}, (f"idle baseline ignored: {exc.message} "
                    "(record a new one with `gpuwarden baseline record` on an idle node)")
    return {int(k): int(v["vram_bytes"]) for k, v in data["gpus"].items()}, None


def baseline(state_dir: Path, cache: "FileCache | None" = None) -> dict[int, int]:
    return baseline_or_warning(state_dir, cache)[0]


def set_baseline(state_dir: Path, values: dict[int, int], backend: str) -> None:
    """Record idle VRAM per GPU, keeping other GPUs' values (a corrupt file is replaced whole)."""
    try:
        data = statefiles.load(state_dir / statedir.BASELINE, statefiles.BASELINE, {"gpus": {}}, root=state_dir)
    except StateFileError:
        data = {"gpus": {}}
    gpus = dict(data["gpus"])
    now = time.time()
    for gpu, value in values.items():
        gpus[str(gpu)] = {"vram_bytes": int(value), "recorded_at": now, "backend": backend}
    statedir.write_json(state_dir / statedir.BASELINE, {"gpus": gpus}, root=state_dir)
