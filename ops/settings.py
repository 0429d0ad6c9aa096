"""Where gpuwarden reads and writes: state dir, config file, backend choice, /sys and /proc roots.

Built once per command from global options and GPUWARDEN_* variables; passed down to everything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from .paths import BACKENDS, DEFAULT_CONFIG, default_state_dir  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Settings:
    state_dir: Path
    config_path: Path = DEFAULT_CONFIG
    backend: str | None = None  # None: choose automatically
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    dev_root: Path = Path("/dev")
    # Host files outside /sys and /proc that `doctor` reads (limits.conf, the kernel config, ROCm's
    # version file); a bundle or a captured tree points them at its own copies.
    etc_root: Path = Path("/etc")
    boot_root: Path = Path("/boot")
    opt_root: Path = Path("/opt")
    # Set when reading a captured tree (bundle replay): nothing live may be touched.
    replay: str | None = None
    # The global options given on the command line (not from variables): a command a hint names
    # repeats them, so it acts on the same node when pasted.
    cli_words: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, **overrides: object) -> "Settings":
        """Resolve each field: explicit override, else GPUWARDEN_* variable, else default."""
        env = os.environ

        def pick(key: str, var: str, default: object) -> object:
            value = overrides.get(key)
            if value not in (None, ""):
                return value
            if env.get(var):
                return env[var]
            return default

        backend = pick("backend", "GPUWARDEN_BACKEND", None)
        if backend == "auto":
            backend = None
        return cls(
            state_dir=Path(str(pick("state_dir", "GPUWARDEN_STATE_DIR", default_state_dir()))),
            config_path=Path(str(pick("config_path", "GPUWARDEN_CONFIG", DEFAULT_CONFIG))),
            backend=str(backend) if backend else None,
            sysfs_root=Path(str(pick("sysfs_root", "GPUWARDEN_SYSFS_ROOT", "/sys"))),
            proc_root=Path(str(pick("proc_root", "GPUWARDEN_PROC_ROOT", "/proc"))),
            dev_root=Path(str(pick("dev_root", "GPUWARDEN_DEV_ROOT", "/dev"))),
            etc_root=Path(str(pick("etc_root", "GPUWARDEN_ETC_ROOT", "/etc"))),
            boot_root=Path(str(pick("boot_root", "GPUWARDEN_BOOT_ROOT", "/boot"))),
            opt_root=Path(str(pick("opt_root", "GPUWARDEN_OPT_ROOT", "/opt"))),
        )

    def with_(self, **changes: object) -> "Settings":
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def live(self) -> bool:
        """True when reading the real node (not a captured tree)."""
        return self.replay is None and self.proc_root == Path("/proc")
