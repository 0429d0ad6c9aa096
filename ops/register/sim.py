"""The sim runtime: records each registration in the sim node (ops.sim.registrations), copies on the host.

The GPU number recorded is the node's, translated through the *_VISIBLE_DEVICES variables like a real runtime.
"""

from __future__ import annotations

import os
from pathlib import Path

from ops.settings import Settings

from .base import DEFAULT_COPY_BUFFER, CopyResult, Registration, Runtime, host_copy, physical_gpu


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
        from ops.sim import registrations
        registrations.add(self.state_dir, gpu=self.gpu, size=size, address=address, path=getattr(self, "_path", None))

    def _unregister_one(self, address: int, size: int, reg: Registration) -> None:
        from ops.sim import registrations
        registrations.remove(self.state_dir, gpu=self.gpu, address=address)

    def _device_address(self, reg: Registration) -> int | None:
        # A distinct, made-up device address, so nothing can pass the host one off as the device's.
        return (1 << 47) | (reg.host_address & ((1 << 40) - 1))

    def copy_to_device(self, reg: Registration, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        return host_copy(reg.host_address, reg.size, buffer_size)
