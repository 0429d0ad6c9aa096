"""NVML's sized queries (a GPU's process lists, its per-process utilisation) asked once into a kept buffer.

nvidia-ml-py's wrappers ask each twice, once for the count and once to fill an array of that size; a sampler that
keeps its arrays between refreshes asks once, and twice only when the array proved too small.
"""

from __future__ import annotations

import ctypes

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): `status` tries this backend on every node
if TYPE_CHECKING:
    from typing import Any

# nvml.h's return codes the sized calls answer with (nvmlReturn_t).
SUCCESS = 0
INSUFFICIENT_SIZE = 7
# usedGpuMemory when NVML may not say (NVML_VALUE_NOT_AVAILABLE, an unsigned long long of all ones).
NOT_AVAILABLE = (1 << 64) - 1
# A node's GPU runs a few processes; the first array holds this many and grows to what the driver asks for.
FIRST_SIZE = 32

Processes = list[tuple[int, "int | None"]]  # (pid, used bytes or None)
Samples = list[tuple[int, int, int, int, int, int]]  # (pid, timestamp us, sm %, mem %, enc %, dec %)


class SizedQueries:
    """The sized calls of one NVML library, through nvidia-ml-py's function lookup and structs. Each
    (symbol, handle) keeps its own array: a GPU's lane asks only for its own handle, so no two threads fill one."""

    def __init__(self, nv: Any):
        self._nv = nv
        self._lookup = nv._nvmlGetFunctionPointer
        self._process_struct = nv.c_nvmlProcessInfo_v3_t
        self._sample_struct = nv.c_nvmlProcessUtilizationSample_t
        self._functions: dict[str, Any] = {}
        self._arrays: dict[tuple[str, int], Any] = {}

    @classmethod
    def open(cls, nv: Any) -> SizedQueries | None:
        """None where this nvidia-ml-py lacks the lookup or the structs: its wrappers are used instead."""
        if not all(hasattr(nv, n) for n in ("_nvmlGetFunctionPointer", "c_nvmlProcessInfo_v3_t",
                                             "c_nvmlProcessUtilizationSample_t", "NVMLError")):
            return None
        return cls(nv)

    def _function(self, symbol: str) -> Any:
        fn = self._functions.get(symbol)
        if fn is None:  # NVMLError_FunctionNotFound on a driver without the symbol: the caller's fallback
            fn = self._functions[symbol] = self._lookup(symbol)
        return fn

    def _ask(self, symbol: str, handle: Any, struct: Any, call: Any) -> tuple[Any, int]:
        """call(fn, array, count) into the kept array; again into a larger one when the driver wants more room.
        Returns the array and how many entries the driver wrote."""
        fn = self._function(symbol)
        key = (symbol, id(handle))
        array = self._arrays.get(key)
        if array is None:
            array = self._arrays[key] = (struct * FIRST_SIZE)()
        count = ctypes.c_uint(len(array))
        ret = call(fn, array, count)
        if ret == INSUFFICIENT_SIZE:
            # Room for what the driver asked for and as many again: a process that starts meanwhile still fits.
            array = self._arrays[key] = (struct * (count.value * 2 + 8))()
            count.value = len(array)
            ret = call(fn, array, count)
        if ret != SUCCESS:
            raise self._nv.NVMLError(ret)
        return array, min(count.value, len(array))

    def processes(self, symbol: str, handle: Any) -> Processes:
        """A running-processes list (nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3's signature)."""
        array, n = self._ask(symbol, handle, self._process_struct,
                             lambda fn, a, c: fn(handle, ctypes.byref(c), a))
        out: Processes = []
        for i in range(n):  # the entries share the kept array: copied out before the next ask
            p = array[i]
            used = int(p.usedGpuMemory)
            out.append((int(p.pid), None if used == NOT_AVAILABLE else used))
        return out

    def lister(self, symbol: str) -> Any:
        """processes(symbol, handle) as a one-argument lister, named for what a late read reports."""
        def listed(handle: Any) -> Processes:
            return self.processes(symbol, handle)
        listed.__name__ = symbol
        listed.sized = True  # type: ignore[attr-defined]  # its answer is (pid, bytes) pairs already
        return listed

    def utilisation(self, handle: Any, since_us: int) -> Samples:
        """nvmlDeviceGetProcessUtilization's samples newer than since_us; NVMLError as NVML answers (NOT_FOUND:
        none since then)."""
        stamp = ctypes.c_ulonglong(since_us)
        array, n = self._ask("nvmlDeviceGetProcessUtilization", handle, self._sample_struct,
                             lambda fn, a, c: fn(handle, a, ctypes.byref(c), stamp))
        out: Samples = []
        for i in range(n):
            s = array[i]
            out.append((int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil), int(s.encUtil),
                        int(s.decUtil)))
        return out
