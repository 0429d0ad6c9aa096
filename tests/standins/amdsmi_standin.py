"""A stand-in `amdsmi` built from one version's real API (functions, signatures, enums, exceptions,
result keys in amdsmi_api/*.json) that replays captured readings and rejects what amdsmi would reject.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import types
from pathlib import Path
from typing import Any

from .amd_smi_capture import ReplayGpu, ReplayNode, ReplayProcess
from .contract import ContractViolation, bind

API_DIR = Path(__file__).parent / "amdsmi_api"
VERSIONS = ("rocm-6.0.0", "rocm-6.1.0", "rocm-6.2.0", "amdsmi-7.0.2")
TOO_OLD = "rocm-5.5.0"  # the pre-6.0 API (device handles, amdsmi_dev_* names): refused in one line
MIB = 1 << 20
# amdsmi_status_t values (amdsmi_wrapper.py of the 7.0.2 wheel; unchanged since 6.x)
NOT_SUPPORTED, NO_PERM, DRIVER_NOT_LOADED = 2, 10, 34
_STATUS_TEXT = {NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
                NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
                DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded"}


@functools.lru_cache(maxsize=None)
def load_api(version: str) -> dict:
    return json.loads((API_DIR / f"{version}.json").read_text())


# Anything the real library would reject (wrong arity, a non-handle, a plain int where an enum is
# expected, reading a key the real function never returns) raises ContractViolation, which the backend
# cannot swallow; whatever a capture does not show answers as the library does for an unsupported call.


class ProcessorHandle:
    def __init__(self, index: int):
        self.index = index


class ProcessHandle:
    def __init__(self, gpu: int, slot: int):
        self.gpu, self.slot = gpu, slot


def keys_in_any_version(fn: str) -> set[str]:
    return set().union(*(load_api(v)["functions"].get(fn, {}).get("returns_keys", []) for v in VERSIONS))


class ReplayDict(dict):
    """A result dict that carries only keys this version's function returns. Indexing must name one of
    them; .get() may also ask for a key another version returns (version-tolerant code), never a typo."""

    def __init__(self, full: dict[str, Any], allowed: set[str], anywhere: set[str], where: str):
        super().__init__({k: v for k, v in full.items() if k in allowed})
        self._allowed, self._anywhere, self._where = allowed, anywhere, where

    def __getitem__(self, key: object) -> Any:
        if key not in self._allowed:
            raise ContractViolation(f"{self._where} never returns key {key!r}")
        return super().__getitem__(key)

    def get(self, key: object, default: Any = None) -> Any:
        if key not in self._anywhere:
            raise ContractViolation(f"{self._where} returns key {key!r} in no known version")
        return super().get(key, default)


def _signature(params: list[dict]) -> inspect.Signature:
    kinds = {"positional": inspect.Parameter.POSITIONAL_OR_KEYWORD,
             "var_positional": inspect.Parameter.VAR_POSITIONAL,
             "keyword_only": inspect.Parameter.KEYWORD_ONLY,
             "var_keyword": inspect.Parameter.VAR_KEYWORD}
    out = []
    for p in params:
        default = inspect.Parameter.empty
        if p["default"] and p["kind"] in ("positional", "keyword_only"):
            default = None
        out.append(inspect.Parameter(p["name"], kinds[p["kind"]], default=default))
    return inspect.Signature(out)


class _Replay:
    """The answers, per function, for one captured node in one API version's shapes."""

    def __init__(self, mod: types.ModuleType, api: dict, node: ReplayNode):
        self.mod, self.api, self.node = mod, api, node

    def _gpu(self, handle: ProcessorHandle) -> ReplayGpu:
        return self.node.gpus[handle.index]

    def _na(self, fn: str) -> Any:
        return "N/A" if self.api["functions"][fn]["says_na"] else 0xFFFF

    def _dict(self, fn: str, full: dict[str, Any]) -> ReplayDict:
        allowed = set(self.api["functions"][fn]["returns_keys"])
        return ReplayDict(full, allowed, keys_in_any_version(fn), f"{self.api['label']} {fn}")

    def unsupported(self) -> BaseException:
        return self.mod.AmdSmiLibraryException(NOT_SUPPORTED)

    def known(self, value: Any) -> Any:
        if value is None:
            raise self.unsupported()
        return value

    # -- the functions a capture can answer --------------------------------------------------
    def amdsmi_init(self, flag: Any = None) -> None:
        if self.mod._init_error is not None:
            raise self.mod.AmdSmiLibraryException(self.mod._init_error)

    def amdsmi_shut_down(self) -> None:
        return None

    def amdsmi_get_processor_handles(self) -> list[ProcessorHandle]:
        return [ProcessorHandle(i) for i in range(len(self.node.gpus))]

    def amdsmi_get_gpu_device_bdf(self, h: ProcessorHandle) -> str:
        return self.known(self._gpu(h).bdf)

    def amdsmi_get_gpu_asic_info(self, h: ProcessorHandle) -> dict:
        name = self._gpu(h).market_name
        return self._dict("amdsmi_get_gpu_asic_info", {
            "market_name": name or "N/A", "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "N/A", "device_id": "N/A", "rev_id": "N/A", "asic_serial": "N/A", "oam_id": "N/A",
            "num_compute_units": "N/A", "target_graphics_version": "N/A", "subsystem_id": "N/A"})

    def _memory(self, h: ProcessorHandle, mem_type: Any, used: bool) -> int:
        if mem_type != self.mod.AmdSmiMemoryType.VRAM:
            raise self.unsupported()  # GTT / visible VRAM are in no capture
        gpu = self._gpu(h)
        return self.known(gpu.vram_used if used else gpu.vram_total)

    def amdsmi_get_gpu_memory_total(self, h: ProcessorHandle, mem_type: Any) -> int:
        return self._memory(h, mem_type, used=False)

    def amdsmi_get_gpu_memory_usage(self, h: ProcessorHandle, mem_type: Any) -> int:
        return self._memory(h, mem_type, used=True)

    def amdsmi_get_gpu_vram_usage(self, h: ProcessorHandle) -> dict:
        gpu = self._gpu(h)
        if gpu.vram_total is None:
            raise self.unsupported()
        return self._dict("amdsmi_get_gpu_vram_usage",
                          {"vram_total": gpu.vram_total // MIB, "vram_used": gpu.vram_used // MIB})

    def amdsmi_get_gpu_activity(self, h: ProcessorHandle) -> dict:
        na = self._na("amdsmi_get_gpu_activity")
        gfx = self._gpu(h).gfx_activity
        return self._dict("amdsmi_get_gpu_activity", {
            "gfx_activity": na if gfx is None else gfx, "umc_activity": na, "mm_activity": na})

    def amdsmi_get_gpu_metrics_info(self, h: ProcessorHandle) -> dict:
        gpu = self._gpu(h)
        keys = self.api["functions"]["amdsmi_get_gpu_metrics_info"]["returns_keys"]
        full: dict[str, Any] = {k: "N/A" for k in keys}
        # amd-smi monitor's POWER is current_socket_power, or average_socket_power where the
        # metrics table has no current value (6.1's has none).
        power_key = "current_socket_power" if "current_socket_power" in keys else "average_socket_power"
        for key, value in (("temperature_hotspot", gpu.hotspot_c), ("temperature_mem", gpu.mem_temp_c),
                           ("average_gfx_activity", gpu.gfx_activity), (power_key, gpu.socket_power_w)):
            if value is not None:
                full[key] = value
        return self._dict("amdsmi_get_gpu_metrics_info", full)

    def amdsmi_get_temp_metric(self, h: ProcessorHandle, sensor_type: Any, metric: Any) -> int:
        kinds, gpu = self.mod.AmdSmiTemperatureType, self._gpu(h)
        if metric != self.mod.AmdSmiTemperatureMetric.CURRENT:
            raise self.unsupported()
        by_sensor = {kinds.HOTSPOT: gpu.hotspot_c, kinds.VRAM: gpu.mem_temp_c}
        return self.known(by_sensor.get(sensor_type))  # EDGE: MI300-class boards have no edge sensor

    def amdsmi_get_power_info(self, h: ProcessorHandle) -> dict:
        na = self._na("amdsmi_get_power_info")
        watts = self._gpu(h).socket_power_w
        watts = na if watts is None else watts
        return self._dict("amdsmi_get_power_info", {
            "socket_power": watts, "current_socket_power": watts, "average_socket_power": na,
            "gfx_voltage": na, "soc_voltage": na, "mem_voltage": na, "power_limit": na})

    def _process_dict(self, fn: str, proc: ReplayProcess) -> dict:
        memory = {k: v for k, v in (("gtt_mem", proc.gtt), ("cpu_mem", proc.cpu), ("vram_mem", proc.vram))
                  if v is not None}
        full: dict[str, Any] = {"name": proc.name or ("N/A" if self._na(fn) == "N/A" else ""), "pid": proc.pid,
                                "engine_usage": self._dict(fn, {"gfx": 0, "enc": 0}), "cu_occupancy": "N/A"}
        if proc.mem is not None:
            full["mem"] = proc.mem
        if memory:
            full["memory_usage"] = self._dict(fn, memory)
        return self._dict(fn, full)

    def amdsmi_get_gpu_process_list(self, h: ProcessorHandle) -> list:
        procs = self._gpu(h).processes
        if "amdsmi_get_gpu_process_info" in self.api["functions"]:
            return [ProcessHandle(h.index, i) for i in range(len(procs))]
        return [self._process_dict("amdsmi_get_gpu_process_list", p) for p in procs]

    def amdsmi_get_gpu_process_info(self, h: ProcessorHandle, process: ProcessHandle) -> dict:
        if process.gpu != h.index:
            raise self.mod.AmdSmiLibraryException(NOT_SUPPORTED)
        return self._process_dict("amdsmi_get_gpu_process_info", self._gpu(h).processes[process.slot])


def build(version: str, node: ReplayNode, *, init_error: int | None = None) -> types.ModuleType:
    """A module object that looks like `import amdsmi` of `version` on the captured node."""
    api = load_api(version)
    mod = types.ModuleType("amdsmi", f"stand-in amdsmi ({api['label']}) replaying {node.label}")
    mod._init_error = init_error
    mod.calls = []
    mod.api = api
    _add_exceptions(mod, api)
    for name, members in api["enums"].items():
        setattr(mod, name, enum.IntEnum(name, members))
    replay = _Replay(mod, api, node)
    for name, spec in api["functions"].items():
        setattr(mod, name, _function(mod, replay, name, spec))
    return mod


def _add_exceptions(mod: types.ModuleType, api: dict) -> None:
    def library_init(self: Exception, err_code: int) -> None:
        Exception.__init__(self, err_code)
        self.err_code = abs(err_code)

    def error_info(self: Exception, *args: Any, **kwargs: Any) -> str:
        return _STATUS_TEXT.get(getattr(self, "err_code", -1), "AMDSMI_STATUS_UNKNOWN_ERROR")

    pending = dict(api["exceptions"])
    while pending:
        progress = False
        for name, base in list(pending.items()):
            base_cls = Exception if base == "Exception" else getattr(mod, base, None)
            if not (isinstance(base_cls, type) and issubclass(base_cls, Exception)):
                continue  # not built yet, or not an exception at all (5.5's AmdSmiRetCode is an IntEnum)
            progress = True
            body: dict[str, Any] = {}
            if name == "AmdSmiLibraryException":
                body = {"__init__": library_init, "get_error_info": error_info}
            setattr(mod, name, type(name, (base_cls,), body))
            del pending[name]
        if not progress:
            break


def _function(mod: types.ModuleType, replay: _Replay, name: str, spec: dict):
    sig = _signature(spec["params"])
    enum_params = {p["name"]: p["annotation"] for p in spec["params"]
                   if p["annotation"] in replay.api["enums"]}
    answer = getattr(replay, name, None)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = bind(name, sig, args, kwargs)
        for pname, value in bound.arguments.items():
            if pname == "processor_handle" and not isinstance(value, ProcessorHandle):
                raise ContractViolation(f"{name}: processor_handle must be a handle, got {value!r}")
            if pname in enum_params and not isinstance(value, getattr(mod, enum_params[pname])):
                raise ContractViolation(f"{name}: {pname} must be {enum_params[pname]}, got {value!r}")
            if pname == "process" and not isinstance(value, ProcessHandle):
                raise ContractViolation(f"{name}: process must be a process handle, got {value!r}")
        mod.calls.append(name)
        if answer is None:
            raise replay.unsupported()
        return answer(*bound.args, **bound.kwargs)

    call.__name__ = name
    call.__signature__ = sig  # type: ignore[attr-defined]
    return call
