"""Where gpuwarden reads and writes: state dir, config file, backend choice, /sys and /proc roots.

Built once per command from global options and GPUWARDEN_* variables; passed down to everything.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation.paths import BACKENDS, DEFAULT_CONFIG, default_state_dir  # noqa: F401 (re-exported)
from gpuwarden.ops.foundation.records import record, replace
from gpuwarden.ops.foundation.deadline import check_seconds
from gpuwarden.ops.foundation.errors import GpuwardenError


@record
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
    # The live host's / mounted elsewhere (a DaemonSet's /host): its /sys and /proc are read there, yet the
    # node is live, so the real backends are used. Without it, a non-default root means a captured tree.
    host_root: Path | None = None
    # Seconds a read of a GPU source (a sysfs file, an amdsmi or NVML call) may take before the GPU counts as
    # STALE and the refresh goes on without it (gpuwarden.ops.foundation.deadline); --read-timeout / GPUWARDEN_READ_TIMEOUT.
    read_timeout_s: float = 3.0

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
        host = pick("host_root", "GPUWARDEN_HOST_ROOT", None)
        host_root: Path | None = None
        if host is not None:
            # The host's own /sys and /proc under its mount point; --sysfs-root/--proc-root do not mix with it.
            host_root = Path(str(host))
            sysfs_root, proc_root = host_root / "sys", host_root / "proc"
        else:
            sysfs_root = Path(str(pick("sysfs_root", "GPUWARDEN_SYSFS_ROOT", "/sys")))
            proc_root = Path(str(pick("proc_root", "GPUWARDEN_PROC_ROOT", "/proc")))
        timeout = pick("read_timeout_s", "GPUWARDEN_READ_TIMEOUT", 3.0)
        try:
            timeout = float(timeout)  # type: ignore[arg-type]
        except ValueError:
            raise GpuwardenError(f"GPUWARDEN_READ_TIMEOUT={timeout!r} is not a number of seconds",
                                 "e.g. GPUWARDEN_READ_TIMEOUT=3 (the default)") from None
        return cls(
            read_timeout_s=check_seconds(timeout, "--read-timeout/GPUWARDEN_READ_TIMEOUT"),
            state_dir=Path(str(pick("state_dir", "GPUWARDEN_STATE_DIR", default_state_dir()))),
            config_path=Path(str(pick("config_path", "GPUWARDEN_CONFIG", DEFAULT_CONFIG))),
            backend=str(backend) if backend else None,
            dev_root=Path(str(pick("dev_root", "GPUWARDEN_DEV_ROOT", "/dev"))),
            etc_root=Path(str(pick("etc_root", "GPUWARDEN_ETC_ROOT", "/etc"))),
            boot_root=Path(str(pick("boot_root", "GPUWARDEN_BOOT_ROOT", "/boot"))),
            opt_root=Path(str(pick("opt_root", "GPUWARDEN_OPT_ROOT", "/opt"))),
            sysfs_root=sysfs_root, proc_root=proc_root, host_root=host_root,
        )

    def with_(self, **changes: object) -> "Settings":
        return replace(self, **changes)

    @property
    def captured(self) -> bool:
        """True when the roots hold a captured tree (a bundle, a test's fixture), not this live node."""
        if self.replay is not None:
            return True
        return self.host_root is None and (self.sysfs_root != Path("/sys") or self.proc_root != Path("/proc"))

    @property
    def live(self) -> bool:
        """True when reading the real node (not a captured tree), through the host's roots or our own."""
        return self.replay is None and (self.host_root is not None or self.proc_root == Path("/proc"))
