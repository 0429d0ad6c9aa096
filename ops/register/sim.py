"""The sim runtime: records each registration in the sim node (gpuwarden.ops.sim.registrations), copies on the host.

The GPU number recorded is the node's, translated through *_VISIBLE_DEVICES; GPUWARDEN_SIM_KFD_LIMIT (bytes or
a size such as 24GiB) makes registrations past that node-wide sum fail, as KFD's system-memory limit does.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.settings import Settings
from gpuwarden.ops.units import fmt_bytes, parse_size

from .base import DEFAULT_COPY_BUFFER, CopyResult, RegisterFailed, Registration, Runtime, host_copy, physical_gpu

ENV_LIMIT = "GPUWARDEN_SIM_KFD_LIMIT"


class SimRuntime(Runtime):
    name = "sim"

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else Settings.from_env().state_dir

    def open(self, gpu: int) -> None:
        self.gpu = physical_gpu(gpu, os.environ)

    def register(self, address: int, size: int, *, chunk_size: int | None = None, path: str | None = None) -> Registration:
        self._path = path
        return super().register(address, size, chunk_size=chunk_size, path=path)

    def _register_one(self, address: int, size: int, reg: Registration) -> None:
        from gpuwarden.ops.sim import registrations
        limit = os.environ.get(ENV_LIMIT)
        if not limit:
            registrations.add(self.state_dir, gpu=self.gpu, size=size, address=address,
                              path=getattr(self, "_path", None))
            return
        from gpuwarden.ops.sim.node import SimNode
        # Like KFD: one node-wide counter, checked and charged under one lock (KFD's is a spinlock), so
        # registrations at once cannot all slip under the limit together.
        with SimNode(self.state_dir)._lock():
            used = registrations.charged(self.state_dir)
            if used + size > parse_size(limit):
                raise RegisterFailed(
                    f"sim: registering {fmt_bytes(size)} on GPU {self.gpu} failed: out of memory "
                    f"(simulated KFD system limit {fmt_bytes(parse_size(limit))}, {fmt_bytes(used)} already charged)",
                    "see `gpuwarden arena budget`")
            registrations.add(self.state_dir, gpu=self.gpu, size=size, address=address,
                              path=getattr(self, "_path", None))

    def _unregister_one(self, address: int, size: int, reg: Registration) -> None:
        from gpuwarden.ops.sim import registrations
        registrations.remove(self.state_dir, gpu=self.gpu, address=address)

    def _device_address(self, reg: Registration) -> int | None:
        # A distinct, made-up device address, so nothing can pass the host one off as the device's.
        return (1 << 47) | (reg.host_address & ((1 << 40) - 1))

    def copy_to_device(self, reg: Registration, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        return host_copy(reg.host_address, reg.size, buffer_size)
