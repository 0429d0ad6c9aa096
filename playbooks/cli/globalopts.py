"""The global options (--state-dir, --config, --backend, --sysfs-root, --proc-root, --read-timeout) turned into Settings.

One function for the Typer callback and for status's fast path; the resolution itself is ops/config/loader.resolve.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.ops.config import loader
from gpuwarden.ops.foundation.settings import Settings


def resolve(state_dir: Path | None = None, config: Path | None = None, backend: str | None = None,
            sysfs_root: Path | None = None, proc_root: Path | None = None,
            read_timeout: float | str | None = None) -> Settings:
    """Settings from the options (each falls back to its GPUWARDEN_* variable, the node config, the default)."""
    return loader.resolve({"state_dir": state_dir, "config": config, "backend": backend, "sysfs_root": sysfs_root,
                           "proc_root": proc_root, "read_timeout": read_timeout})
