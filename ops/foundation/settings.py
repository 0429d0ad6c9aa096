"""Where gpuwarden reads and writes: state dir, config file, backend choice, /sys and /proc roots.

Built once per command by ops/config/loader.resolve (options, GPUWARDEN_* variables, node config, defaults);
passed down to everything.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.ops.foundation.paths import BACKENDS, DEFAULT_CONFIG, default_state_dir  # noqa: F401 (re-exported)
from gpuwarden.ops.foundation.records import record, replace


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
