"""The sim backend: the sysfs backend reading the simulated node's tree, after a driver sync.

Labelled simulated everywhere it is shown; its device files live under <state dir>/sim/dev.
"""

from __future__ import annotations

import time

from ..errors import BackendUnavailable
from ..settings import Settings
from ..sim.node import SimNode
from .sysfs import SysfsBackend


class SimBackend(SysfsBackend):
    def __init__(self, settings: Settings, *, create: bool = False, min_sync_interval_s: float = 0.0):
        self.node = SimNode(settings.state_dir)
        if not self.node.exists:
            if not create:
                raise BackendUnavailable(
                    f"sim: no simulated node in {settings.state_dir} (create one with `gpuwarden sim init`)")
            self.node.init()
        self._min_sync = min_sync_interval_s
        self._last_sync = 0.0
        self.node.sync()
        super().__init__(sysfs_root=self.node.sysfs_root, dev_root=self.node.dev_root, name="sim", simulated=True)

    def sync(self) -> None:
        now = time.monotonic()
        if now - self._last_sync >= self._min_sync:
            self.node.sync()
            self._last_sync = now

    def gpus(self):
        self.sync()
        return super().gpus()
