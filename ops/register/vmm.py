"""The cuda and hip runtimes' shared-by-descriptor mode: a VMM allocation at a host location, exported as a POSIX fd.

keeper: create (pinned, host NUMA node 0) -> export fd -> reserve + map + set access -> load the arena into it;
importer: import fd -> reserve + map + set access for its GPU -> copy to a device buffer (GB/s).
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import TYPE_CHECKING, Any

from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.ops.register.base import DEFAULT_COPY_BUFFER, CopyResult, RuntimeUnavailable
from gpuwarden.ops.register.share import Shared, ShareFailed


class VmmShare:
    """Mixed into a GpuRuntime; subclasses supply the binding's spellings (_create ... _free_device)."""

    name: str
    gpu: int

    def _check(self, result: Any, what: str) -> Any:
        raise NotImplementedError

    def _granularity(self, prop: Any) -> int:
        raise NotImplementedError

    if TYPE_CHECKING:  # the binding's spellings, which CudaVmm and HipVmm define
        def _prop(self) -> Any: ...
        def _create(self, size: int, prop: Any) -> Any: ...
        def _export(self, handle: Any) -> int: ...
        def _import(self, fd: int) -> Any: ...
        def _reserve(self, size: int) -> Any: ...
        def _map_handle(self, ptr: Any, size: int, handle: Any) -> Any: ...
        def _set_access(self, ptr: Any, size: int) -> Any: ...
        def _copy(self, dst: int, src: int, n: int, *, to_device: bool) -> Any: ...
        def _sync(self) -> Any: ...
        def _alloc_device(self, n: int) -> Any: ...
        def _free_device(self, ptr: Any) -> None: ...
        def _unmap(self, address: int, size: int) -> None: ...
        def _release_handle(self, handle: Any) -> None: ...

    def share_create(self, size: int) -> Shared:
        t0 = time.perf_counter()
        prop = self._prop()
        gran = self._granularity(prop)
        size = (size + gran - 1) // gran * gran
        handle = self._check(self._create(size, prop), f"creating {fmt_bytes(size)} of host memory (host NUMA node 0)")
        try:
            fd = self._export(handle)
            address = self._map(handle, size)
        except BaseException:
            self._release_handle(handle)
            raise
        return Shared(self.name, fd, size, address, seconds=time.perf_counter() - t0, keeper=True,
                      handles={"handle": handle})

    def share_import(self, fd: int, size: int) -> Shared:
        t0 = time.perf_counter()
        try:
            handle = self._check(self._import(fd), "importing the keeper's descriptor")
        except BaseException:
            os.close(fd)
            raise
        try:
            address = self._map(handle, size)
        except BaseException:
            self._release_handle(handle)
            os.close(fd)
            raise
        return Shared(self.name, fd, size, address, seconds=time.perf_counter() - t0, handles={"handle": handle})

    def _map(self, handle: Any, size: int) -> int:
        ptr = self._check(self._reserve(size), f"reserving {fmt_bytes(size)} of address space")
        try:
            self._check(self._map_handle(ptr, size, handle), "mapping the allocation")
            self._check(self._set_access(ptr, size), f"granting GPU {self.gpu} access")
        except BaseException:
            self._unmap(int(ptr), size)
            raise
        return int(ptr)

    def share_fill(self, shared: Shared, source: int, size: int) -> CopyResult:
        t0 = time.perf_counter()
        self._check(self._copy(shared.address, source, min(size, shared.size), to_device=False), "loading the arena")
        self._check(self._sync(), "loading the arena")
        return CopyResult(size, time.perf_counter() - t0)

    def share_copy_to_device(self, shared: Shared, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        total = shared.payload or shared.size
        n = max(1, min(total, buffer_size))
        dbuf = self._check(self._alloc_device(n), f"allocating a {fmt_bytes(n)} device buffer")
        try:
            self._check(self._sync(), "synchronizing")
            t0 = time.perf_counter()
            off = 0
            while off < total:
                step = min(n, total - off)
                self._check(self._copy(int(dbuf), shared.address + off, step, to_device=True), "copying to the device")
                off += step
            self._check(self._sync(), "copying to the device")
            return CopyResult(total, time.perf_counter() - t0)
        finally:
            self._free_device(dbuf)

    def share_release(self, shared: Shared) -> None:
        self._unmap(shared.address, shared.size)
        self._release_handle(shared.handles["handle"])
        os.close(shared.fd)


class CudaVmm(VmmShare):
    """cuda.bindings.driver (cuMem*): the runtime API has no VMM calls."""

    def _drv(self) -> Any:
        if getattr(self, "_d", None) is None:
            try:
                # optional (cuda-bindings), and only --share on the cuda runtime needs it
                # deferred: optional extra [cuda]
                from cuda.bindings import driver
            except ImportError:
                raise RuntimeUnavailable("cuda: --share needs cuda-bindings' driver module (cuda.bindings.driver)",
                                         "pip install 'cuda-bindings>=12.6'") from None
            self._d = driver
            self._check(driver.cuInit(0), "cuInit")
            dev = self._check(driver.cuDeviceGet(self.gpu), f"opening GPU {self.gpu}")
            ctx = self._check(driver.cuDevicePrimaryCtxRetain(dev), "retaining the primary context")
            self._check(driver.cuCtxSetCurrent(ctx), "making the context current")
            self._dev = int(dev)
        return self._d

    def _check(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            name = getattr(err, "name", str(err))
            raise ShareFailed(f"cuda: {what} failed: {name}",
                              "see `gpuwarden known` (VMM host allocations shared by descriptor), or drop --share") from None
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)

    def _prop(self) -> Any:
        d = self._drv()
        p = d.CUmemAllocationProp()
        p.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        # HOST with a POSIX fd is refused (CUDA_ERROR_INVALID_VALUE, as documented); HOST_NUMA is not.
        p.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        p.location.id = 0
        p.requestedHandleTypes = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return p

    def _granularity(self, prop: Any) -> int:
        d = self._drv()
        return int(self._check(d.cuMemGetAllocationGranularity(
            prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM), "asking the granularity"))

    def _create(self, size: int, prop: Any) -> Any:
        return self._drv().cuMemCreate(size, prop, 0)

    def _export(self, handle: Any) -> int:
        d = self._drv()
        return int(self._check(d.cuMemExportToShareableHandle(
            handle, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "exporting a descriptor"))

    def _import(self, fd: int) -> Any:
        d = self._drv()
        return d.cuMemImportFromShareableHandle(fd, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)

    def _reserve(self, size: int) -> Any:
        return self._drv().cuMemAddressReserve(size, 0, 0, 0)

    def _map_handle(self, ptr: Any, size: int, handle: Any) -> Any:
        return self._drv().cuMemMap(ptr, size, 0, handle, 0)

    def _set_access(self, ptr: Any, size: int) -> Any:
        d = self._drv()
        access = d.CUmemAccessDesc()
        access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self._dev
        access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return d.cuMemSetAccess(ptr, size, [access], 1)

    def _copy(self, dst: int, src: int, n: int, *, to_device: bool) -> Any:
        d = self._drv()
        if to_device:  # both ends are device addresses: the GPU reads the host pages through the mapping
            return d.cuMemcpyDtoD(d.CUdeviceptr(dst), d.CUdeviceptr(src), n)
        return d.cuMemcpyHtoD(d.CUdeviceptr(dst), src, n)

    def _sync(self) -> Any:
        return self._drv().cuCtxSynchronize()

    def _alloc_device(self, n: int) -> Any:
        return self._drv().cuMemAlloc(n)

    def _free_device(self, ptr: Any) -> None:
        self._drv().cuMemFree(ptr)

    def _unmap(self, address: int, size: int) -> None:
        d = self._drv()
        d.cuMemUnmap(d.CUdeviceptr(address), size)
        d.cuMemAddressFree(d.CUdeviceptr(address), size)

    def _release_handle(self, handle: Any) -> None:
        self._drv().cuMemRelease(handle)


class HipVmm(VmmShare):
    """hip-python's hipMem* VMM calls (HIP's documented API; the location is hipMemLocationTypeHost)."""

    api: Any  # the HipApi: .mod is `hip`

    def _check(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        code: Any = getattr(err, "value", err)  # an enum member from hip-python, or a plain int
        if int(code) != 0:
            name = getattr(err, "name", str(err))
            if self.api.unavailable(err):
                raise RuntimeUnavailable(f"hip: no usable GPU here: {what} failed: {name}",
                                         "run on a node with the GPU driver loaded, or use --runtime sim")
            raise ShareFailed(f"hip: {what} failed: {name}",
                              "see `gpuwarden known` (VMM host allocations shared by descriptor), or drop --share")
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)

    def _prop(self) -> Any:
        h = self.api.mod
        p = h.hipMemAllocationProp()
        p.type = h.hipMemAllocationType.hipMemAllocationTypePinned
        p.location.type = h.hipMemLocationType.hipMemLocationTypeHost
        p.location.id = 0
        # hip-python exposes no accessor for the handle type: it sits in an anonymous union right after `type`
        # (HIP's header). Write it through the union's own wrapper at that offset, once the layout is confirmed.
        offset = int(p.location) - int(p) - 4
        if offset != 4:
            raise ShareFailed(f"hip: this hip-python lays out hipMemAllocationProp unexpectedly (location at +{offset + 4})",
                              "use a hip-python matching HIP's hipMemAllocationProp, or the registered mode")
        union = h.hipMemAllocationProp_union_0.fromObj(int(p) + offset)
        union.requestedHandleTypes = h.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor
        return p

    def _granularity(self, prop: Any) -> int:
        h = self.api.mod
        return int(self._check(h.hipMemGetAllocationGranularity(
            prop, h.hipMemAllocationGranularity_flags.hipMemAllocationGranularityMinimum), "asking the granularity"))

    def _create(self, size: int, prop: Any) -> Any:
        return self.api.mod.hipMemCreate(size, prop, 0)

    def _export(self, handle: Any) -> int:
        h = self.api.mod
        out = ctypes.c_int(-1)
        self._check(h.hipMemExportToShareableHandle(
            ctypes.addressof(out), handle, h.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor, 0),
            "exporting a descriptor")
        return out.value

    def _import(self, fd: int) -> Any:
        h = self.api.mod
        # HIP takes the descriptor's value in the void* osHandle argument.
        return h.hipMemImportFromShareableHandle(fd, h.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor)

    def _reserve(self, size: int) -> Any:
        return self.api.mod.hipMemAddressReserve(size, 0, None, 0)

    def _map_handle(self, ptr: Any, size: int, handle: Any) -> Any:
        return self.api.mod.hipMemMap(ptr, size, 0, handle, 0)

    def _set_access(self, ptr: Any, size: int) -> Any:
        h = self.api.mod
        desc = h.hipMemAccessDesc()
        desc.location.type = h.hipMemLocationType.hipMemLocationTypeDevice
        desc.location.id = self.gpu
        desc.flags = h.hipMemAccessFlags.hipMemAccessFlagsProtReadWrite
        return h.hipMemSetAccess(ptr, size, desc, 1)

    def _copy(self, dst: int, src: int, n: int, *, to_device: bool) -> Any:
        h = self.api.mod
        kind = h.hipMemcpyKind.hipMemcpyDeviceToDevice if to_device else h.hipMemcpyKind.hipMemcpyHostToDevice
        return h.hipMemcpy(dst, src, n, kind)

    def _sync(self) -> Any:
        return self.api.mod.hipDeviceSynchronize()

    def _alloc_device(self, n: int) -> Any:
        return self.api.mod.hipMalloc(n)

    def _free_device(self, ptr: Any) -> None:
        self.api.mod.hipFree(ptr)

    def _unmap(self, address: int, size: int) -> None:
        self.api.mod.hipMemUnmap(address, size)
        self.api.mod.hipMemAddressFree(address, size)

    def _release_handle(self, handle: Any) -> None:
        self.api.mod.hipMemRelease(handle)

