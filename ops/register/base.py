"""The registration runtime interface: register a host range with one GPU, copy it to the device, unregister.

Implementations: hip (hip-python), cuda (cuda-bindings), host (mlock), sim (records in the sim node);
select.get(name) finds one, so this module imports none of them (and none of them imports it back in a circle).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from typing import Mapping

from gpuwarden.ops.foundation.errors import GpuwardenError

from gpuwarden.ops.register.share import Shared, ShareFailed

RUNTIMES = ("hip", "cuda", "host", "sim")
DEFAULT_COPY_BUFFER = 1 << 30


class RuntimeUnavailable(GpuwardenError):
    """The runtime cannot work here (library missing, no driver, no GPU)."""


class RegisterFailed(GpuwardenError):
    """The runtime refused the registration (or the copy); the message carries its error."""


@dataclass
class Registration:
    """One registered host range, possibly as several chunks; device_address is what device code must use."""

    runtime: str
    gpu: int
    host_address: int
    size: int
    device_address: int | None = None
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (host address, bytes) as registered
    seconds: float = 0.0
    detail: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"runtime": self.runtime, "gpu": self.gpu, "bytes": self.size, "chunks": len(self.chunks),
                "register_seconds": round(self.seconds, 4),
                "device_address": hex(self.device_address) if self.device_address is not None else None,
                **self.detail}


@dataclass(frozen=True)
class CopyResult:
    bytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class Runtime:
    """Subclass per runtime. `open(gpu)` before use; every method raises GpuwardenError subclasses only."""

    name = "base"

    def open(self, gpu: int) -> None:
        self.gpu = gpu

    def register(self, address: int, size: int, *, chunk_size: int | None = None, path: str | None = None) -> Registration:
        """Register [address, address+size) in one call, or in chunk_size pieces; time it."""
        pieces = split(address, size, chunk_size)
        reg = Registration(self.name, self.gpu, address, size)
        t0 = time.perf_counter()
        try:
            for a, n in pieces:
                self._register_one(a, n, reg)
                reg.chunks.append((a, n))
        except BaseException:
            self._undo(reg)
            raise
        reg.seconds = time.perf_counter() - t0
        reg.device_address = self._device_address(reg)
        return reg

    def copy_to_device(self, reg: Registration, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        raise NotImplementedError

    def unregister(self, reg: Registration) -> None:
        errors = self._undo(reg)
        if errors:
            raise RegisterFailed(f"{self.name}: unregister failed: {errors[0]}")

    def close(self) -> None:
        pass

    # Shared-by-descriptor mode (canary --share): the keeper creates and fills, importers import; both copy and
    # release. Runtimes that support it override all five.
    def share_create(self, size: int) -> "Shared":
        raise ShareFailed(f"{self.name}: the {self.name} runtime has no shared-by-descriptor mode",
                          "use --runtime cuda, hip or sim with --share, or drop --share")

    def share_fill(self, shared: "Shared", source: int, size: int) -> CopyResult:
        raise NotImplementedError

    def share_import(self, fd: int, size: int) -> "Shared":
        return self.share_create(size)  # the same refusal

    def share_copy_to_device(self, shared: "Shared", buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        raise NotImplementedError

    def share_release(self, shared: "Shared") -> None:
        raise NotImplementedError

    # Hooks for subclasses.
    def _register_one(self, address: int, size: int, reg: Registration) -> None:
        raise NotImplementedError

    def _unregister_one(self, address: int, size: int, reg: Registration) -> None:
        raise NotImplementedError

    def _device_address(self, reg: Registration) -> int | None:
        return None

    def _undo(self, reg: Registration) -> list[str]:
        errors = []
        while reg.chunks:
            a, n = reg.chunks.pop()
            try:
                self._unregister_one(a, n, reg)
            except GpuwardenError as exc:
                errors.append(str(exc))
        return errors


def split(address: int, size: int, chunk_size: int | None) -> list[tuple[int, int]]:
    if not chunk_size or chunk_size >= size:
        return [(address, size)]
    if chunk_size % 4096:
        raise GpuwardenError(f"registration chunk {chunk_size} is not a multiple of 4096", "e.g. --register-chunk 1GiB")
    return [(address + off, min(chunk_size, size - off)) for off in range(0, size, chunk_size)]


def host_copy(address: int, size: int, buffer_size: int) -> CopyResult:
    """memcpy the range through one bounded buffer: the host runtimes' stand-in for a device copy."""
    buf = ctypes.create_string_buffer(max(1, min(size, buffer_size)))
    dst = ctypes.addressof(buf)
    t0 = time.perf_counter()
    off = 0
    while off < size:
        n = min(len(buf), size - off)
        ctypes.memmove(dst, address + off, n)
        off += n
    return CopyResult(size, time.perf_counter() - t0)


def physical_gpu(index: int, env: Mapping[str, str] | None = None) -> int:
    """The node's GPU number for device `index` as a process with this environment numbers them."""
    env = os.environ if env is None else env
    current = index
    # Applied innermost last: ROCr filters first, then HIP (or CUDA) index into what is left.
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        value = env.get(var)
        if not value:
            continue
        items = [x.strip() for x in value.split(",") if x.strip()]
        if current < len(items) and items[current].isdigit():
            current = int(items[current])
    return current
