"""node_exporter's textfile collector: one exposition written atomically as <dir>/gpuwarden.prom, so the collector
never reads half a file (the temporary name does not end in .prom, which the collector ignores).
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.atomicfile import replace

FILENAME = "gpuwarden.prom"


def write(directory: Path, body: bytes) -> Path:
    if not directory.is_dir():
        raise GpuwardenError(f"--textfile {directory} is not a directory",
                             "give node_exporter's --collector.textfile.directory (create it first)")
    path = directory / FILENAME
    try:
        replace(path, body, 0o644)  # node_exporter often runs as another user: it must read it
    except PermissionError:
        raise GpuwardenError(f"no permission to write {path}", "run as a user that may write there (root)") from None
    except OSError as exc:
        raise GpuwardenError(f"cannot write {path}: {exc.strerror or exc}", "check the directory and its disk") from None
    return path
