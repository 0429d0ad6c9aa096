"""A stand-in `pynvml`: the real nvidia-ml-py constants, errors, structs and nvml* signatures, answering
from a captured nvidia-smi report with the structs NVML fills, and rejecting calls pynvml would reject.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import pynvml as real

from .contract import ContractViolation, bind
from .nvsmi_capture import MIB, SmiGpu


# Wrong arity or a non-handle raises ContractViolation (which the backend cannot swallow); a call a
# capture cannot answer raises NVMLError_NotSupported, as NVML does for an unsupported query.


class DeviceHandle:
    def __init__(self, index: int):
        self.index = index


class _Replay:
    def __init__(self, mod: types.ModuleType, gpus: list[SmiGpu], *, init_error: int | None,
                 memory_v2: bool, process_memory: bool, process_v3: bool, denied: frozenset[int]):
        self.mod, self.gpus = mod, gpus
        self.init_error, self.memory_v2, self.process_memory = init_error, memory_v2, process_memory
        self.process_v3, self.denied = process_v3, denied

    def _gpu(self, handle: DeviceHandle) -> SmiGpu:
        return self.gpus[handle.index]

    @staticmethod
    def _known(value: Any) -> Any:
        if value is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> DeviceHandle:
        if not 0 <= index < len(self.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if index in self.denied:  # its /dev/nvidiaN is not ours to open
            raise real.NVMLError(real.NVML_ERROR_NO_PERMISSION)
        return DeviceHandle(index)

    def nvmlDeviceGetName(self, handle: DeviceHandle) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: DeviceHandle) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetMinorNumber(self, handle: DeviceHandle) -> int:
        return self._known(self._gpu(handle).minor)

    def nvmlDeviceGetPciInfo(self, handle: DeviceHandle) -> Any:
        gpu = self._gpu(handle)
        info = real.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = gpu.bus_id.encode()
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: DeviceHandle, version: Any = None) -> Any:
        gpu = self._gpu(handle)
        total, reserved, used, free = (gpu.fb(k) for k in ("Total", "Reserved", "Used", "Free"))
        if version:
            if not self.memory_v2:  # a pre-r510 driver has no nvmlDeviceGetMemoryInfo_v2 symbol
                raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
            mem = real.c_nvmlMemory_v2_t()
            mem.version, mem.total, mem.reserved, mem.used, mem.free = version, total, reserved, used, free
            return mem
        mem = real.c_nvmlMemory_t()
        # v1: used is everything not free, the driver's reservation included (NVML reference).
        mem.total, mem.free, mem.used = total, free, total - free
        return mem

    def nvmlDeviceGetUtilizationRates(self, handle: DeviceHandle) -> Any:
        gpu = self._gpu(handle)
        rates = real.c_nvmlUtilization_t()
        rates.gpu = int(self._known(gpu.utilization))
        rates.memory = int(gpu.number("Utilization.Memory") or 0)
        return rates

    def nvmlDeviceGetEncoderUtilization(self, handle: DeviceHandle) -> list[int]:
        # [percent, sampling period in us]; nvidia-smi -q prints no period, and gpuwarden reads only the percent
        return [int(self._gpu(handle).number("Utilization.Encoder") or 0), 0]

    def nvmlDeviceGetDecoderUtilization(self, handle: DeviceHandle) -> list[int]:
        return [int(self._gpu(handle).number("Utilization.Decoder") or 0), 0]

    def nvmlDeviceGetTemperature(self, handle: DeviceHandle, sensor: int) -> int:
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return int(self._known(self._gpu(handle).temperature))

    def nvmlDeviceGetTemperatureV(self, handle: DeviceHandle, sensor: int, version: Any = None) -> int:
        return self.nvmlDeviceGetTemperature(handle, sensor)

    def nvmlDeviceGetPowerUsage(self, handle: DeviceHandle) -> int:
        return round(self._known(self._gpu(handle).power_w) * 1000)  # NVML counts milliwatts

    # --- the sensors (what `nvidia-smi -q` prints under Clocks, Max Clocks, Fan Speed, GPU Power Readings,
    # PCI.GPU Link Info and Clocks Event Reasons; "N/A" there is NVML's NOT_SUPPORTED)
    _CLOCK_KEYS = {real.NVML_CLOCK_SM: "SM", real.NVML_CLOCK_MEM: "Memory"}
    _REASON_KEYS = (("Idle", real.nvmlClocksEventReasonGpuIdle),
                    ("Applications Clocks Setting", real.nvmlClocksEventReasonApplicationsClocksSetting),
                    ("SW Power Cap", real.nvmlClocksEventReasonSwPowerCap),
                    ("HW Slowdown", real.nvmlClocksEventReasonHwSlowdown),
                    ("HW Slowdown.HW Thermal Slowdown", real.nvmlClocksEventReasonHwThermalSlowdown),
                    ("HW Slowdown.HW Power Brake Slowdown", real.nvmlClocksEventReasonHwPowerBrakeSlowdown),
                    ("Sync Boost", real.nvmlClocksEventReasonSyncBoost),
                    ("SW Thermal Slowdown", real.nvmlClocksEventReasonSwThermalSlowdown),
                    ("Display Clock Setting", real.nvmlClocksEventReasonDisplayClockSetting))

    def _clock(self, handle: DeviceHandle, section: str, kind: int) -> int:
        name = self._CLOCK_KEYS.get(kind)
        if name is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return int(self._known(self._gpu(handle).number(f"{section}.{name}")))

    def nvmlDeviceGetClockInfo(self, handle: DeviceHandle, type: int) -> int:
        return self._clock(handle, "Clocks", type)

    def nvmlDeviceGetMaxClockInfo(self, handle: DeviceHandle, type: int) -> int:
        return self._clock(handle, "Max Clocks", type)

    def nvmlDeviceGetFanSpeed(self, handle: DeviceHandle) -> int:
        return int(self._known(self._gpu(handle).number("Fan Speed")))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: DeviceHandle) -> int:
        watts = self._gpu(handle).number("GPU Power Readings.Current Power Limit", "Power Readings.Power Limit")
        return round(self._known(watts) * 1000)

    def _link(self, handle: DeviceHandle, key: str) -> int:
        return int(self._known(self._gpu(handle).number(f"PCI.GPU Link Info.{key}")))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: DeviceHandle) -> int:
        return self._link(handle, "PCIe Generation.Current")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: DeviceHandle) -> int:
        return self._link(handle, "PCIe Generation.Max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: DeviceHandle) -> int:
        return self._link(handle, "Link Width.Current")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: DeviceHandle) -> int:
        return self._link(handle, "Link Width.Max")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: DeviceHandle) -> int:
        gpu = self._gpu(handle)
        states = [(gpu.get(f"Clocks Event Reasons.{k}", f"Clocks Throttle Reasons.{k}"), bit)
                  for k, bit in self._REASON_KEYS]
        if all(state is None for state, _ in states):
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return sum(bit for state, bit in states if state == "Active")

    # --- what `doctor` asks: the -q report's "Persistence Mode", "MIG Mode", "ECC Mode", "Retired Pages",
    # "Remapped Rows", "VBIOS Version" ("N/A" there is NVML's NOT_SUPPORTED)
    def _state(self, handle: DeviceHandle, key: str) -> int:
        value = self._known(self._gpu(handle).get(key))
        return real.NVML_FEATURE_ENABLED if value == "Enabled" else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetPersistenceMode(self, handle: DeviceHandle) -> int:
        return self._state(handle, "Persistence Mode")

    def nvmlDeviceGetMigMode(self, handle: DeviceHandle) -> list[int]:
        return [self._state(handle, "MIG Mode.Current"), self._state(handle, "MIG Mode.Pending")]

    def nvmlDeviceGetEccMode(self, handle: DeviceHandle) -> list[int]:
        return [self._state(handle, "ECC Mode.Current"), self._state(handle, "ECC Mode.Pending")]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: DeviceHandle) -> int:
        value = self._known(self._gpu(handle).get("Retired Pages.Pending Page Blacklist"))
        return real.NVML_FEATURE_ENABLED if value == "Yes" else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: DeviceHandle) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle)
        corr, unc = self._known(gpu.get("Remapped Rows.Correctable Error")), gpu.get("Remapped Rows.Uncorrectable Error")
        pending, failure = gpu.get("Remapped Rows.Pending"), gpu.get("Remapped Rows.Remapping Failure Occurred")
        return int(corr), int(unc or 0), int(pending == "Yes"), int(failure == "Yes")

    def nvmlDeviceGetTotalEccErrors(self, handle: DeviceHandle, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle)
        if errorType == real.NVML_MEMORY_ERROR_TYPE_CORRECTED and counterType == real.NVML_VOLATILE_ECC:
            parts = [gpu.number(f"ECC Errors.Volatile.{where} Correctable") for where in ("DRAM", "SRAM")]
            parts = [p for p in parts if p is not None] or [gpu.number("ECC Errors.Volatile.Single Bit.Total")]
            return int(sum(self._known(p) for p in parts))
        if errorType != real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counterType != real.NVML_VOLATILE_ECC:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        value = gpu.number("ECC Errors.Volatile.DRAM Uncorrectable", "ECC Errors.Volatile.Double Bit.Total")
        return int(self._known(value))

    def nvmlDeviceGetVbiosVersion(self, handle: DeviceHandle) -> str:
        return self._known(self._gpu(handle).get("VBIOS Version"))

    def _processes(self, handle: DeviceHandle, kind: str) -> list:
        out = []
        for p in self._gpu(handle).processes:
            if kind not in p.kind.split("+"):
                continue
            struct = real.c_nvmlProcessInfo_v3_t()
            struct.pid = p.pid
            unknown = p.used_mib is None or not self.process_memory
            struct.usedGpuMemory = real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if unknown else p.used_mib * MIB
            struct.gpuInstanceId = struct.computeInstanceId = 0xFFFFFFFF
            obj = real.nvmlStructToFriendlyObject(struct)
            if obj.usedGpuMemory == real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None  # what pynvml itself does with the sentinel
            out.append(obj)
        return out

    def _v3(self, handle: DeviceHandle, kind: str) -> list:
        if not self.process_v3:  # pre-r510 driver: pynvml's unversioned wrapper finds no _v3 symbol
            raise real.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does "
                                                "not match the NVML lib version.")
        return self._processes(handle, kind)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: DeviceHandle) -> list:
        return self._v3(handle, "C")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: DeviceHandle) -> list:
        return self._v3(handle, "G")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: DeviceHandle) -> list:
        return self._processes(handle, "C")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: DeviceHandle) -> list:
        return self._processes(handle, "G")


    def nvmlDeviceGetProcessUtilization(self, handle: DeviceHandle, timeStamp: int) -> list:
        """NVML's documented answer: the samples newer than timeStamp (us), NOT_FOUND when there are none."""
        newer = [s for s in self.utilisation.get(handle.index, ()) if s[1] > timeStamp]
        if not newer:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        out = []
        for pid, stamp, sm, mem, enc, dec in newer:
            struct = real.c_nvmlProcessUtilizationSample_t()
            struct.pid, struct.timeStamp, struct.smUtil, struct.memUtil = pid, stamp, sm, mem
            struct.encUtil, struct.decUtil = enc, dec
            out.append(struct)
        return out


def build(gpus: list[SmiGpu], *, init_error: int | None = None, memory_v2: bool = True,
          process_memory: bool = True, process_v3: bool = True,
          denied: frozenset[int] = frozenset(),
          utilisation: dict[int, list[tuple[int, int, int, int, int, int]]] | None = None) -> types.ModuleType:
    """A module that looks like `import pynvml` on the node the capture describes. `utilisation`: gpu index ->
    process samples (pid, timestamp us, sm, mem, enc, dec) nvmlDeviceGetProcessUtilization answers from; without
    it the call is NOT_SUPPORTED, as nvidia-smi -q captures say nothing about it."""
    mod = types.ModuleType("pynvml", "stand-in pynvml replaying nvidia-smi -q")
    mod.calls = []
    replay = _Replay(mod, gpus, init_error=init_error, memory_v2=memory_v2, process_memory=process_memory,
                     process_v3=process_v3, denied=denied)
    replay.utilisation = utilisation or {}
    if utilisation is None:
        replay.nvmlDeviceGetProcessUtilization = None  # type: ignore[assignment]
    for name in dir(real):
        obj = getattr(real, name)
        if name.startswith("nvml") and inspect.isfunction(obj):
            setattr(mod, name, _function(mod, replay, name, inspect.signature(obj)))
        elif not name.startswith("__"):
            setattr(mod, name, obj)
    return mod


def _function(mod: types.ModuleType, replay: _Replay, name: str, sig: inspect.Signature):
    answer = getattr(replay, name, None)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = bind(name, sig, args, kwargs)
        handle = bound.arguments.get("handle")
        if "handle" in sig.parameters and not isinstance(handle, DeviceHandle):
            raise ContractViolation(f"{name}: handle must come from nvmlDeviceGetHandleByIndex, got {handle!r}")
        mod.calls.append(name)
        if answer is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return answer(*bound.args, **bound.kwargs)

    call.__name__ = name
    call.__signature__ = sig  # type: ignore[attr-defined]
    return call
