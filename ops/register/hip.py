"""The hip runtime: hipHostRegister(Portable|Mapped) through hip-python (`from hip import hip`).

hip-python imports without ROCm but raises RuntimeError at the first call when libamdhip64.so is missing;
both become one RuntimeUnavailable line.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.register.base import RuntimeUnavailable
from gpuwarden.ops.register.gpu import GpuApi, GpuRuntime
from gpuwarden.ops.register.vmm import HipVmm

_UNAVAILABLE = {"hipErrorNoDevice", "hipErrorInsufficientDriver", "hipErrorInvalidDevice",
                "hipErrorNotInitialized", "hipErrorInitializationError"}


def _import() -> Any:
    try:
        # deferred: vendor library (hip-python), imported where used as libload does: only the hip runtime needs it
        from hip import hip
        return hip
    except ImportError:
        raise RuntimeUnavailable("hip: the hip runtime needs hip-python, which is not installed",
                                 "pip install hip-python matching your ROCm, or use --runtime host/sim") from None
    except Exception as exc:  # a build for another ROCm raises at import; still one line
        raise RuntimeUnavailable(f"hip: hip-python failed to load: {exc}", "reinstall hip-python for your ROCm") from None


class HipApi(GpuApi):
    prefix = "hip"

    def __init__(self) -> None:
        self.mod = _import()
        self.register_flags = int(self.mod.hipHostRegisterPortable) | int(self.mod.hipHostRegisterMapped)
        self.h2d = self.mod.hipMemcpyKind.hipMemcpyHostToDevice

    def unavailable(self, err: Any) -> bool:
        return self.error_name(err) in _UNAVAILABLE

    def call(self, name: str, *args: Any) -> tuple[Any, ...]:
        try:
            return super().call(name, *args)
        except RuntimeError as exc:
            if "libamdhip64" in str(exc) or "dlopen" in str(exc):
                raise RuntimeUnavailable("hip: libamdhip64.so is not installed (ROCm's HIP runtime)",
                                         "install ROCm (or put its lib dir on LD_LIBRARY_PATH), or use --runtime host/sim") from None
            raise RuntimeUnavailable(f"hip: {exc}", "check the ROCm install") from None


class HipRuntime(HipVmm, GpuRuntime):
    name = "hip"

    def __init__(self) -> None:
        self.api = HipApi()
