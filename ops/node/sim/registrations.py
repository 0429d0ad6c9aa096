"""The sim node's record of arena registrations: one JSON file per registration under <state dir>/sim/registrations/.

Written by the sim runtime when a canary registers, removed when it unregisters; a record whose process
has died is stale (the crash left it) and is reported as such, the way a real driver leaks one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuwarden.ops.foundation import statedir, statefiles
from gpuwarden.ops.foundation.errors import GpuwardenError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any

DIRNAME = Path("sim") / "registrations"


def directory(state_dir: Path) -> Path:
    return Path(state_dir) / DIRNAME


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # Field 22 (starttime) counts from after the ")" that closes comm, which may itself hold spaces.
    rest = text.rsplit(")", 1)[-1].split()
    return int(rest[19]) if len(rest) > 19 else None


def add(state_dir: Path, *, gpu: int, size: int, address: int, path: str | None, chunks: int = 1) -> Path:
    """Record a registration by this process; returns the record's path."""
    pid = os.getpid()
    record = {"pid": pid, "start_ticks": _start_ticks(pid), "gpu": gpu, "bytes": size, "address": hex(address),
              "arena": path, "chunks": chunks, "since": time.time()}
    target = directory(state_dir) / f"{pid}-{gpu}-{address:x}.json"
    statedir.write_json(target, record, root=Path(state_dir))
    return target


def remove(state_dir: Path, *, gpu: int, address: int) -> bool:
    return statedir.unlink(directory(state_dir) / f"{os.getpid()}-{gpu}-{address:x}.json", root=Path(state_dir))


def list_all(state_dir: Path) -> list[dict[str, Any]]:
    """Every record, each with "stale": True when its process is gone (or the pid was reused)."""
    out = []
    for name in sorted(statedir.listdir(directory(state_dir), root=Path(state_dir))):
        if not name.endswith(".json"):
            continue
        try:
            rec = statefiles.load(directory(state_dir) / name, statefiles.REGISTRATION, root=Path(state_dir))
        except (OSError, GpuwardenError):
            continue  # not a registration record
        if rec is None:
            continue
        alive = _start_ticks(rec.get("pid", -1)) == rec.get("start_ticks")
        out.append({**rec, "stale": not alive})
    return out


def charged(state_dir: Path, gpu: int | None = None) -> int:
    """Bytes registered by live processes (on one GPU, or all)."""
    return sum(r["bytes"] for r in list_all(state_dir) if not r["stale"] and (gpu is None or r["gpu"] == gpu))
