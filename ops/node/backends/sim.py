"""The sim backend: the sysfs backend reading the simulated node's tree, after a driver sync.

Labelled simulated everywhere it is shown; its device files live under <state dir>/sim/dev. Like a real
driver, the simulated one only has work when something changed: a refresh runs its sync only when the
node's config or the set of allocations changed, or when a process holding an allocation exited.
"""

from __future__ import annotations

import os
import time

from gpuwarden.ops.foundation.errors import BackendUnavailable
from gpuwarden.ops.foundation.model import GpuInfo
from gpuwarden.ops.foundation.pidwatch import PidWatch, usable as pidfds_usable
from gpuwarden.ops.node.procs import identity
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.node.backends.sysfs import SysfsBackend


class SimBackend(SysfsBackend):
    def __init__(self, settings: Settings, *, create: bool = False, min_sync_interval_s: float = 0.0,
                 fallback_reason: str | None = None):
        # Why no real backend opened, when the simulated node stands in for one (shown with the SIMULATED label).
        self.fallback_reason = fallback_reason
        self.node = SimNode(settings.state_dir)
        if not self.node.exists:
            if not create:
                raise BackendUnavailable(
                    f"sim: no simulated node in {settings.state_dir} (create one with `gpuwarden sim init`)")
            self.node.init()
        self._min_sync = min_sync_interval_s
        self._last_sync = 0.0
        # (node.json stamp, allocation file names) at the last sync
        self._seen: tuple[tuple[int, ...], ...] | None = None
        self._owners: dict[int, int] = {}  # pid -> start ticks of every allocation's process
        self._zombies: set[int] = set()  # exited owners that keep their allocation (unreaped)
        self._untracked = True
        self._watch = PidWatch() if pidfds_usable(settings.proc_root) else None
        self._full_sync()
        super().__init__(sysfs_root=self.node.sysfs_root, dev_root=self.node.dev_root, name="sim", simulated=True,
                         deadline_s=settings.read_timeout_s)
        # The simulated driver's DRM clients: their fdinfo stands where /proc/<pid>/fdinfo would (ops/node/sim/drm.py).
        self.fdinfo_root = self.node.root / "proc"
        self._drm = self.node.drm
        self._bus_of = self.node.bus_ids()
        self._ticked_on_read = False  # a load reader writes the fdinfo files as it reads them (fdinfo_refresh)

    def _state(self) -> tuple[tuple[int, ...], ...]:
        """Stamps of node.json and of the allocations directory (a file added or removed changes its mtime)."""
        try:
            node, allocs = os.stat(self.node._node_file), os.stat(self.node.allocs_dir)
        except OSError:
            return ()
        return (node.st_mtime_ns, node.st_size, node.st_ino), (allocs.st_mtime_ns, allocs.st_ino)

    def _full_sync(self) -> None:
        self.node.sync()
        # The "hang" drill puts FIFOs where some attributes were: a file held open from before would keep reading
        # the old file, where a real driver's held attribute blocks too, so held files are opened anew.
        hung = self.node.hung_gpus()
        for g in hung - getattr(self, "_hung", set()):
            if g < len(getattr(self, "_gpu_held", ())):
                self._gpu_held[g].close()  # its lanes are idle: only a healthy GPU becomes hung
        self._hung = hung
        self._last_sync = time.monotonic()
        self._seen = self._state()
        if self._watch is None or not self._seen:
            return
        try:
            names = os.listdir(self.node.allocs_dir)
        except OSError:
            names = []
        owners = {}
        for name in names:
            parts = name[:-5].split("-") if name.endswith(".json") else []
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                owners[int(parts[0])] = int(parts[1])
        for pid in set(self._owners) - set(owners):
            self._watch.forget(pid)
        for pid in owners:
            if pid not in self._watch:
                self._watch.track(pid)
        self._owners = owners
        # An owner without a pidfd (gone already, or no descriptor left) could exit unseen: sync every time then.
        self._untracked = any(pid not in self._watch for pid in owners)
        exited = self._watch.exited()
        self._zombies = {p for p in exited if identity(p) == owners.get(p)}

    def sync(self) -> None:
        now = time.monotonic()
        if now - self._last_sync < self._min_sync:
            return
        state = self._state()
        # A change within the file system's timestamp tick of the last look would leave the stamps equal:
        # stamps younger than a second are not trusted.
        recent = bool(state) and time.time() - max(state[0][0], state[1][0]) / 1e9 < 1.0
        if self._watch is None or self._untracked or recent or state != self._seen or self._owner_exited():
            self._full_sync()

    def _owner_exited(self) -> bool:
        """True when a process holding an allocation exited since the last sync (a zombie keeps its own)."""
        for pid in self._watch.exited():  # type: ignore[union-attr]
            if pid not in self._zombies or identity(pid) != self._owners.get(pid):
                return True
        return False

    def gpus(self) -> list[GpuInfo]:
        self.sync()
        if not self._ticked_on_read and self._drm.clients():
            self._drm.tick(self._bus_of)  # the engine time of busy clients grows, as a real driver's does
        return super().gpus()

    def fdinfo_refresh(self) -> None:
        """Write the DRM clients' fdinfo as of now, right before a reader reads them: a kernel makes the file at
        read time, so a figure written at gpus() would be off by however late the read came (on a loaded host,
        a client busy half the time read as 83%)."""
        self._ticked_on_read = True
        if self._drm.clients():
            self._drm.tick(self._bus_of)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        super().close()
