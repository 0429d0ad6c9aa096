"""Issue 26, item 8, on an NVIDIA node: one host buffer shared by file descriptor (VMM) against per-process
cuMemHostRegister. NOT run on the dev box (no GPU): the lead runs it on the H200.

  python3 tests/device/vmm_host_share.py [--gib 4] [--procs 2] > $OUT/vmm_host_share.json

What it does, with cuda-bindings' documented driver API (cuda.bindings.driver, CUDA 12.x):
  1. CU_MEM_LOCATION_TYPE_HOST with a POSIX-descriptor handle: expected to be refused (CUDA_ERROR_INVALID_VALUE);
  2. the keeper: cuMemCreate(size, pinned, location HOST_NUMA node 0, handle type POSIX FD), timed (the pin),
     cuMemExportToShareableHandle -> fd, passed to each importer over a unix socket (SCM_RIGHTS);
  3. each importer: cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, cuMemSetAccess for its GPU
     (timed), then cuMemcpyDtoD of the whole buffer into device memory: GB/s;
  4. the peer, per process: mmap + cuMemHostRegister(DEVICEMAP) of the same size (timed) and the same copy.
Prints one JSON object: timings, GB/s, and for each step the CUresult name. The rest of what issue 26 asks of
this mode lives in the canary now (--share keeper|import, ops/register/vmm.py); tests/device/vmm_share.sh measures it.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import socket
import sys
import time


def drv():
    from cuda.bindings import driver  # type: ignore
    return driver


def ok(result, what: str):
    """cuda-bindings calls return (CUresult, *values): raise with the error's name unless CUDA_SUCCESS."""
    d = drv()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {d.CUresult(err).name}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def context(gpu: int):
    d = drv()
    ok(d.cuInit(0), "cuInit")
    dev = ok(d.cuDeviceGet(gpu), "cuDeviceGet")
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ok(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev


def prop(location_type, location_id: int):
    d = drv()
    p = d.CUmemAllocationProp()
    p.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = location_type
    p.location.id = location_id
    p.requestedHandleTypes = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return p


def rounded(size: int, p) -> int:
    d = drv()
    gran = ok(d.cuMemGetAllocationGranularity(
        p, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
    return (size + gran - 1) // gran * gran


def copy_gbps(src, size: int) -> float:
    d = drv()
    dst = ok(d.cuMemAlloc(size), "cuMemAlloc")
    ok(d.cuCtxSynchronize(), "sync")
    t = time.perf_counter()
    ok(d.cuMemcpyDtoD(dst, src, size), "cuMemcpyDtoD")
    ok(d.cuCtxSynchronize(), "sync")
    s = time.perf_counter() - t
    ok(d.cuMemFree(dst), "cuMemFree")
    return size / s / 1e9


def importer(s: socket.socket, gpu: int, size: int, q) -> None:
    d = drv()
    try:
        dev = context(gpu)
        _msg, fds, _flags, _addr = socket.recv_fds(s, 16, 1)
        t = time.perf_counter()
        handle = ok(d.cuMemImportFromShareableHandle(
            fds[0], d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle")
        ptr = ok(d.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        ok(d.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
        access = d.CUmemAccessDesc()
        access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = int(dev)
        access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        ok(d.cuMemSetAccess(ptr, size, [access], 1), "cuMemSetAccess")
        mapped_s = time.perf_counter() - t
        gbps = copy_gbps(ptr, size)
        ok(d.cuMemUnmap(ptr, size), "cuMemUnmap")
        ok(d.cuMemAddressFree(ptr, size), "cuMemAddressFree")
        ok(d.cuMemRelease(handle), "cuMemRelease")
        q.put({"gpu": gpu, "import_map_s": round(mapped_s, 4), "copy_gbps": round(gbps, 1)})
    except Exception as exc:  # one line per importer for the lead, not a traceback
        q.put({"gpu": gpu, "error": str(exc)})


def registered(gpu: int, size: int, q) -> None:
    d = drv()
    try:
        context(gpu)
        buf = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        import ctypes
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        t = time.perf_counter()
        ok(d.cuMemHostRegister(addr, size, d.CU_MEMHOSTREGISTER_DEVICEMAP), "cuMemHostRegister")
        reg_s = time.perf_counter() - t
        dptr = ok(d.cuMemHostGetDevicePointer(addr, 0), "cuMemHostGetDevicePointer")
        gbps = copy_gbps(dptr, size)
        ok(d.cuMemHostUnregister(addr), "cuMemHostUnregister")
        q.put({"gpu": gpu, "register_s": round(reg_s, 4), "copy_gbps": round(gbps, 1)})
    except Exception as exc:
        q.put({"gpu": gpu, "error": str(exc)})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--procs", type=int, default=2)
    args = ap.parse_args()
    d = drv()
    out: dict = {"gib": args.gib, "procs": args.procs}
    context(0)
    size = int(args.gib * (1 << 30))
    host = prop(d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST, 0)
    err, _h = d.cuMemCreate(rounded(size, host), host, 0)
    out["host_location_posix_fd"] = d.CUresult(err).name  # documented as refused
    numa = prop(d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)
    size = rounded(size, numa)
    t = time.perf_counter()
    handle = ok(d.cuMemCreate(size, numa, 0), "cuMemCreate HOST_NUMA")
    out["keeper_create_pin_s"] = round(time.perf_counter() - t, 4)
    fd = ok(d.cuMemExportToShareableHandle(
        handle, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    kids, ends = [], []
    for i in range(args.procs):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # a spawned child (CUDA must not be forked) gets the socket through multiprocessing's fd passing
        p = ctx.Process(target=importer, args=(b, i % max(1, ok(d.cuDeviceGetCount(), "count")), size, q))
        p.start()
        socket.send_fds(a, [b"fd"], [int(fd)])
        kids.append(p)
        ends += [a, b]
    out["importers"] = [q.get(timeout=600) for _ in kids]
    for p in kids:
        p.join(60)
    peers = [ctx.Process(target=registered, args=(i % max(1, ok(d.cuDeviceGetCount(), "count")), size, q))
             for i in range(args.procs)]
    for p in peers:  # one after another: each pins its own copy of the pages
        p.start()
        p.join(900)
    out["cuMemHostRegister"] = [q.get(timeout=60) for _ in peers]
    ok(d.cuMemRelease(handle), "cuMemRelease")
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
