"""The global options (--state-dir, --config, --backend, --sysfs-root, --proc-root, --read-timeout) turned into Settings.

One function for the Typer callback and for status's fast path, so both check and resolve them alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import BACKENDS, Settings
from gpuwarden.ops.foundation import statedir


def resolve(state_dir: Path | None = None, config: Path | None = None, backend: str | None = None,
            sysfs_root: Path | None = None, proc_root: Path | None = None,
            read_timeout: float | str | None = None) -> Settings:
    """Settings from the options (each falls back to its GPUWARDEN_* variable, then the default)."""
    if backend and backend not in BACKENDS + ("auto",):
        raise GpuwardenError(f"unknown backend {backend!r}", f"choose one of: {', '.join(BACKENDS)}")
    for flag, root in (("--sysfs-root", sysfs_root), ("--proc-root", proc_root)):
        # A missing /proc tree would show every GPU process as gone and its VRAM as residual.
        if root is not None and not root.is_dir():
            raise GpuwardenError(f"{flag} {root} is not a directory",
                                 "point it at a captured tree (or leave it out to read the live node)")
    if isinstance(read_timeout, str):  # the fast path hands the word over as typed
        try:
            read_timeout = float(read_timeout)
        except ValueError:
            raise GpuwardenError(f"--read-timeout {read_timeout!r} is not a number of seconds",
                                 "e.g. --read-timeout 3 (the default)") from None
    settings = Settings.from_env(state_dir=state_dir, config_path=config, backend=backend,
                                 sysfs_root=sysfs_root, proc_root=proc_root, read_timeout_s=read_timeout)
    if settings.backend and settings.backend not in BACKENDS:  # from GPUWARDEN_BACKEND
        raise GpuwardenError(f"unknown backend {settings.backend!r}", f"choose one of: {', '.join(BACKENDS)}")
    if state_dir is None and not os.environ.get("GPUWARDEN_STATE_DIR") and settings.config_path.exists():
        # deferred: only with a config file: status otherwise goes without nodeconfig (typing, tomllib)
        from gpuwarden.ops.config.nodeconfig import effective_settings  # the config may name the state dir
        settings = effective_settings(settings)
    statedir.check(settings.state_dir)  # not ours, shared with other users, unreadable: one line, now
    return settings
