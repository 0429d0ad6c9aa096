"""The sim runtime: records each registration in the sim node (gpuwarden.ops.node.sim.registrations), copies on the host.

The GPU number recorded is the node's, translated through *_VISIBLE_DEVICES; GPUWARDEN_SIM_KFD_LIMIT (bytes or
a size such as 24GiB) makes charges past that node-wide sum fail, as KFD's system-memory limit does. A
registration is charged once per process whatever GPUs it sees (amdgpu_amdkfd_gpuvm.c, kfd_mem_attach: the
other GPUs get attachments, not reservations); pin() models a pinned host allocation (hipHostMalloc), which
KFD charges against the same counter (a GTT-domain object, amdgpu_amdkfd_reserve_mem_limit).
Its --share allocation is a memfd: the keeper charges it once, importers mmap the passed descriptor.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

from gpuwarden.ops.config import loader
from gpuwarden.ops.foundation.units import fmt_bytes, parse_size
from gpuwarden.ops.node.sim import registrations
from gpuwarden.ops.node.sim.node import SimNode

from gpuwarden.ops.register.base import DEFAULT_COPY_BUFFER, CopyResult, RegisterFailed, Registration, Runtime, host_copy, physical_gpu
from gpuwarden.ops.register.share import Shared, ShareFailed

ENV_LIMIT = "GPUWARDEN_SIM_KFD_LIMIT"


class PinFailed(Exception):
    """A simulated pinned host allocation KFD refused: hipHostMalloc returns hipErrorOutOfMemory."""

    code = "hipErrorOutOfMemory"

    def __init__(self, size: int, used: int, limit: int) -> None:
        self.size, self.used, self.limit = size, used, limit
        super().__init__(f"hipHostMalloc of {fmt_bytes(size)} returned hipErrorOutOfMemory: the simulated KFD "
                         f"ledger holds {fmt_bytes(used)} of its {fmt_bytes(limit)} system-memory limit")


class SimRuntime(Runtime):
    name = "sim"

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else loader.resolve(check=False).state_dir
        self._pinned: list[ctypes.Array[ctypes.c_char]] = []

    def open(self, gpu: int) -> None:
        self.gpu = physical_gpu(gpu, os.environ)

    def register(self, address: int, size: int, *, chunk_size: int | None = None, path: str | None = None) -> Registration:
        self._path = path
        return super().register(address, size, chunk_size=chunk_size, path=path)

    def _register_one(self, address: int, size: int, reg: Registration) -> None:
        limit = os.environ.get(ENV_LIMIT)
        if not limit:
            registrations.add(self.state_dir, gpu=self.gpu, size=size, address=address,
                              path=getattr(self, "_path", None))
            return
        # Like KFD: one node-wide counter, checked and charged under one lock (KFD's is a spinlock), so
        # registrations at once cannot all slip under the limit together.
        with SimNode(self.state_dir)._lock():
            used = registrations.charged(self.state_dir)
            if used + size > parse_size(limit):
                # clr's hipHostRegister answers a memory object it cannot create with hipErrorInvalidValue
                # ("Cannot create memory for size", hip_memory.cpp), not out-of-memory.
                raise RegisterFailed(
                    f"sim: registering {fmt_bytes(size)} on GPU {self.gpu} failed: hipErrorInvalidValue (the "
                    f"simulated KFD refused the userptr object: limit {fmt_bytes(parse_size(limit))}, "
                    f"{fmt_bytes(used)} already charged)", "see `gpuwarden arena budget`")
            registrations.add(self.state_dir, gpu=self.gpu, size=size, address=address,
                              path=getattr(self, "_path", None))

    def pin(self, size: int, seen: int = 0) -> int:
        """A pinned host allocation of `size` bytes (what hipHostMalloc asks KFD for): charged against the same
        node-wide counter as registrations. Returns its address; raises PinFailed past the simulated limit.

        `seen`: the ledger as the caller last saw it. Peers that fail at the same moment die a little later on a
        real node (a crashed process's KFD memory is freed as its teardown completes), so a peer's crash between
        that look and this call does not make room here."""
        buf = ctypes.create_string_buffer(max(1, min(size, 1 << 20)))  # a stand-in: the charge is the point
        address = ctypes.addressof(buf)
        self._pinned.append(buf)
        limit = os.environ.get(ENV_LIMIT)
        with SimNode(self.state_dir)._lock():
            used = max(registrations.charged(self.state_dir), seen)
            if limit and used + size > parse_size(limit):
                raise PinFailed(size, used, parse_size(limit))
            registrations.add(self.state_dir, gpu=self.gpu, size=size, address=address, path=None, kind="gtt",
                              call="hipHostMalloc")
        return address

    def close(self) -> None:
        # The pinned buffers go with the runtime, as hipHostFree would free them; a crash leaves them stale.
        for buf in self._pinned:
            registrations.remove(self.state_dir, gpu=self.gpu, address=ctypes.addressof(buf))
        self._pinned.clear()
        super().close()

    def _unregister_one(self, address: int, size: int, reg: Registration) -> None:
        registrations.remove(self.state_dir, gpu=self.gpu, address=address)

    def _device_address(self, reg: Registration) -> int | None:
        # A distinct, made-up device address, so nothing can pass the host one off as the device's.
        return (1 << 47) | (reg.host_address & ((1 << 40) - 1))

    def copy_to_device(self, reg: Registration, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        return host_copy(reg.host_address, reg.size, buffer_size)

    # Shared-by-descriptor: a memfd stands in for the VMM host allocation; the keeper's record is the one charge.
    # mmap(2) through libc, so an importer's mapping can be read-only and still have an address to copy from.
    def _map(self, fd: int, size: int, keeper: bool) -> Shared:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if keeper else 0)
        address = _LIBC.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            os.close(fd)
            raise ShareFailed(f"sim: mapping the shared descriptor ({fmt_bytes(size)}) failed: {os.strerror(err)}",
                              "restart the keeper")
        return Shared(self.name, fd, size, address, keeper=keeper)

    def share_create(self, size: int) -> Shared:
        limit = os.environ.get(ENV_LIMIT)
        t0 = time.perf_counter()
        if limit:
            used = registrations.charged(self.state_dir)
            if used + size > parse_size(limit):
                raise ShareFailed(f"sim: allocating {fmt_bytes(size)} of shared host memory failed: out of memory "
                                  f"(simulated KFD system limit {fmt_bytes(parse_size(limit))}, {fmt_bytes(used)} already charged)",
                                  "see `gpuwarden arena budget`")
        fd = os.memfd_create("gpuwarden-arena-share", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            os.close(fd)
            raise ShareFailed(f"sim: sizing the shared allocation to {fmt_bytes(size)} failed: {exc.strerror}") from None
        shared = self._map(fd, size, keeper=True)
        registrations.add(self.state_dir, gpu=self.gpu, size=size, address=shared.address, path=None)
        shared.seconds = time.perf_counter() - t0
        return shared

    def share_fill(self, shared: Shared, source: int, size: int) -> CopyResult:
        t0 = time.perf_counter()
        ctypes.memmove(shared.address, source, size)
        return CopyResult(size, time.perf_counter() - t0)

    def share_import(self, fd: int, size: int) -> Shared:
        t0 = time.perf_counter()
        actual = os.fstat(fd).st_size
        if actual < size:
            os.close(fd)
            raise ShareFailed(f"sim: the passed descriptor holds {fmt_bytes(actual)}, the keeper said {fmt_bytes(size)}",
                              "restart the keeper")
        shared = self._map(fd, size, keeper=False)
        shared.seconds = time.perf_counter() - t0
        return shared

    def share_copy_to_device(self, shared: Shared, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        return host_copy(shared.address, shared.payload or shared.size, buffer_size)

    def share_release(self, shared: Shared) -> None:
        if shared.keeper:
            registrations.remove(self.state_dir, gpu=self.gpu, address=shared.address)
        _LIBC.munmap(ctypes.c_void_p(shared.address), shared.size)
        os.close(shared.fd)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mmap.restype = ctypes.c_void_p
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.munmap.restype = ctypes.c_int
    return libc


_LIBC = _libc()
