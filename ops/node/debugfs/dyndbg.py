"""Dynamic debug for KFD's system-memory-limit message: on for the length of a probe, restored after, journaled.

amdgpu_amdkfd_reserve_mem_limit() (drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd_gpuvm.c) prints "Set
no_system_mem_limit=1 if using shared memory" with pr_debug when a charge would cross the limit: invisible unless
dynamic debug enables that call site. The control file and its query language are lib/dynamic_debug.c's
(ddebug_proc_show prints "file:line [module]function =flags \"format\"", ddebug_exec_query takes "func NAME +p").
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuwarden.ops.foundation import journal

CONTROL = Path("kernel") / "debug" / "dynamic_debug" / "control"
FUNCTION = "amdgpu_amdkfd_reserve_mem_limit"
_SITE = re.compile(r"^\S+:\d+ \[(?P<module>[^\]]*)\](?P<function>\S+) =(?P<flags>\S*) ")


class KfdLimitDebug:
    """Turns the call site on (root only) and back off afterwards, if and only if it was off before."""

    def __init__(self, sysfs_root: Path, state_dir: Path, euid: int | None = None) -> None:
        self.control = Path(sysfs_root) / CONTROL
        self.state_dir = state_dir
        self.euid = os.geteuid() if euid is None else euid
        self.enabled_by_us = False

    def _sites(self) -> list[str] | None:
        """The flags of each of the function's call sites, or None when the control file cannot be read."""
        try:
            text = self.control.read_text(errors="replace")
        except OSError:
            return None
        return [m["flags"] for line in text.splitlines() if (m := _SITE.match(line)) and m["function"] == FUNCTION]

    def _query(self, flag: str) -> None:
        # O_APPEND: the kernel's control file takes each write as a query whatever the offset; a captured copy
        # (tests, a replay root) keeps the queries in order instead of overwriting its own listing.
        fd = os.open(self.control, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, f"func {FUNCTION} {flag}\n".encode())
        finally:
            os.close(fd)

    def enable(self) -> str:
        """Turn the message on; one sentence saying what was done (or why not), for the probe to print."""
        what = f"KFD's memory-limit debug message ({FUNCTION}: \"Set no_system_mem_limit=1 if using shared memory\")"
        if self.euid != 0:
            return f"trace: {what} stays off: dynamic debug needs root (run the probe as root to see it in dmesg)"
        sites = self._sites()
        if sites is None:
            return (f"trace: {what} stays off: {self.control} is not readable (debugfs not mounted, or a kernel "
                    "without CONFIG_DYNAMIC_DEBUG)")
        if not sites:
            return f"trace: {what} stays off: {self.control} lists no such call site (amdgpu not loaded?)"
        if all("p" in flags for flags in sites):
            return f"trace: {what} was already on; left as it is"
        try:
            self._query("+p")
        except OSError as exc:
            return f"trace: {what} stays off: writing {self.control} failed ({exc.strerror})"
        self.enabled_by_us = True
        journal.write(self.state_dir, "dynamic-debug", "ok", function=FUNCTION, flag="+p", control=str(self.control),
                      why="arena probe --trace")
        return (f"trace: turned on {what} for the probe (dynamic debug, journaled); it goes to the kernel log "
                "(dmesg) and is turned off again after the probe")

    def restore(self) -> str | None:
        """Turn it off again if this object turned it on; the sentence saying so, or None when nothing was done."""
        if not self.enabled_by_us:
            return None
        self.enabled_by_us = False
        try:
            self._query("-p")
        except OSError as exc:
            journal.write(self.state_dir, "dynamic-debug", "failed", function=FUNCTION, flag="-p", error=exc.strerror)
            return (f"trace: could not turn {FUNCTION}'s debug message off again ({exc.strerror}): "
                    f"echo 'func {FUNCTION} -p' > {self.control}")
        journal.write(self.state_dir, "dynamic-debug", "ok", function=FUNCTION, flag="-p", control=str(self.control),
                      why="arena probe --trace ended")
        return f"trace: turned {FUNCTION}'s debug message off again (as it was before the probe)"
