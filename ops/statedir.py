"""The state dir: layout, creation with safe modes, and atomic writes.

Every file gpuwarden keeps between commands lives here; writers replace files atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import GpuwardenError
from .paths import refuse_squatted  # noqa: F401 (callers import it from here too)

# Layout, relative to the state dir. One place so that every module agrees.
JOURNAL = "journal.log"
LOCKS = "locks"
DRAINED = "drained.json"
BASELINE = "baseline.json"
SIM = "sim"
ENGINES = "engines"
GATE = "gate"
BUNDLES = "bundles"


def ensure(state_dir: Path, *parts: str) -> Path:
    """Create state_dir/parts (mode 0700 for the root of it) and return the path."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = state_dir.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
    except PermissionError as exc:
        raise GpuwardenError(
            f"no permission to create {exc.filename or state_dir} (the state dir is {state_dir})",
            "run as root, or point --state-dir / GPUWARDEN_STATE_DIR at a directory you own",
        ) from None
    except OSError as exc:  # under /proc, a read-only file system, a file where a directory should be
        raise GpuwardenError(
            f"cannot create the state dir {state_dir}: {exc.strerror or exc}",
            "point --state-dir / GPUWARDEN_STATE_DIR at a writable directory",
        ) from None
    refuse_squatted(state_dir)
    return path


def atomic_write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Write via a temp file in the same directory, fsync, rename: readers see old or new, never half."""
    import tempfile  # here: `status` reads state files but never writes one, and tempfile's imports cost
    if isinstance(data, str):
        data = data.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: Path, obj: Any, mode: int = 0o644) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", mode)


def read_json(path: Path, default: Any = None, kind: type | None = None) -> Any:
    """Read a JSON state file; a missing file gives `default`, a corrupt one an error naming it.

    `kind` (else the type of a default that is not None) fixes the shape: another JSON type is corrupt too."""
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except json.JSONDecodeError as exc:
        raise GpuwardenError(
            f"state file {path} is corrupt ({exc.msg} at line {exc.lineno})",
            "move it aside; gpuwarden recreates it",
        ) from None
    kind = kind or (type(default) if default is not None else None)
    if kind is not None and value is not None and not isinstance(value, kind):
        raise GpuwardenError(f"state file {path} is corrupt (a JSON {type(value).__name__}, "
                             f"not the {kind.__name__} gpuwarden writes)",
                             "move it aside; gpuwarden recreates it")
    return value
