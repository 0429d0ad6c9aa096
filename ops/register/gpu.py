"""What the hip and cuda runtimes share: the call sequence around host registration, over a small API adapter.

set device -> HostRegister(Portable|Mapped) -> HostGetDevicePointer -> Malloc + Memcpy H2D (GB/s) -> HostUnregister.
"""

from __future__ import annotations

import time
from typing import Any

from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.ops.register.base import DEFAULT_COPY_BUFFER, CopyResult, RegisterFailed, Registration, Runtime, RuntimeUnavailable


class GpuApi:
    """Adapter over one binding: `call(name, *args)` returns the values after the error code, or raises."""

    prefix = ""  # "hip" or "cuda"
    mod: Any = None

    def code(self, err: Any) -> int:
        return int(getattr(err, "value", err))

    def error_name(self, err: Any) -> str:
        return getattr(err, "name", str(err))

    def describe(self, err: Any) -> str:
        """The binding's words for `err` (<prefix>GetErrorString: bytes, or a tuple that ends with them)."""
        try:
            res = getattr(self.mod, self.prefix + "GetErrorString")(err)
            text = res[-1] if isinstance(res, tuple) else res
            return text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # only words for an error already being reported: never a second failure
            return "no description"

    def unavailable(self, err: Any) -> bool:
        """True for errors that mean "no driver / no GPU here" rather than "this call failed"."""
        return False

    def call(self, name: str, *args: Any) -> tuple[Any, ...]:
        fn = getattr(self.mod, self.prefix + name)
        raw = fn(*args)
        result: tuple[Any, ...] = raw if isinstance(raw, tuple) else (raw,)
        err, rest = result[0], result[1:]
        if self.code(err) != 0:
            what = f"{self.prefix}{name} failed: {self.error_name(err)} ({self.describe(err)})"
            if self.unavailable(err):
                raise RuntimeUnavailable(f"{self.prefix}: no usable GPU here: {what}",
                                         "run on a node with the GPU driver loaded, or use --runtime host/sim")
            raise RegisterFailed(what)
        return rest

    # Constants each binding spells its own way.
    register_flags: int = 0
    h2d: Any = None


class GpuRuntime(Runtime):
    api: GpuApi

    def open(self, gpu: int) -> None:
        self.gpu = gpu
        self.api.call("SetDevice", gpu)

    def _register_one(self, address: int, size: int, reg: Registration) -> None:
        try:
            self.api.call("HostRegister", address, size, self.api.register_flags)
        except RegisterFailed as exc:
            raise RegisterFailed(f"{exc.message} registering {fmt_bytes(size)} at {address:#x} on GPU {self.gpu}",
                                 "see `gpuwarden arena budget` (KFD limit) and RLIMIT_MEMLOCK; try --register-chunk") from None

    def _unregister_one(self, address: int, size: int, reg: Registration) -> None:
        self.api.call("HostUnregister", address)

    def _device_address(self, reg: Registration) -> int | None:
        (ptr,) = self.api.call("HostGetDevicePointer", reg.host_address, 0)
        return int(ptr)

    def copy_to_device(self, reg: Registration, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        # The copy engine reads the pinned pages by DMA: the host address goes to a host API call here,
        # never into device code (that would need reg.device_address).
        n = max(1, min(reg.size, buffer_size))
        (dbuf,) = self.api.call("Malloc", n)
        try:
            self.api.call("DeviceSynchronize")
            t0 = time.perf_counter()
            off = 0
            while off < reg.size:
                step = min(n, reg.size - off)
                self.api.call("Memcpy", dbuf, reg.host_address + off, step, self.api.h2d)
                off += step
            self.api.call("DeviceSynchronize")
            return CopyResult(reg.size, time.perf_counter() - t0)
        finally:
            self.api.call("Free", dbuf)
