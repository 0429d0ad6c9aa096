"""The cuda runtime: cudaHostRegister(Portable|Mapped) through cuda-bindings, new or old module layout.

`from cuda.bindings import runtime` (cuda-bindings >= 12.6) or `from cuda import cudart` (older cuda-python).
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.register.base import RuntimeUnavailable
from gpuwarden.ops.register.gpu import GpuApi, GpuRuntime
from gpuwarden.ops.register.vmm import CudaVmm

# cudaError_t values that mean "no driver or no device", not "this call failed".
_UNAVAILABLE = {"cudaErrorInsufficientDriver", "cudaErrorNoDevice", "cudaErrorInitializationError",
                "cudaErrorSystemDriverMismatch", "cudaErrorCompatNotSupportedOnDevice", "cudaErrorInvalidDevice"}


def _import() -> Any:
    # deferred: optional (cuda-bindings or cuda-python), and only the cuda runtime needs it
    try:
        # deferred: optional extra [cuda]
        from cuda.bindings import runtime as cudart
        return cudart
    except ImportError:
        pass
    try:
        # deferred: optional extra [cuda]
        from cuda import cudart
        return cudart
    except ImportError:
        raise RuntimeUnavailable("cuda: the cuda runtime needs cuda-bindings, which is not installed",
                                 "pip install cuda-bindings (or cuda-python), or use --runtime host/sim") from None
    except Exception as exc:  # a broken install raises at import; still one line
        raise RuntimeUnavailable(f"cuda: cuda-bindings failed to load: {exc}", "reinstall cuda-bindings") from None


class CudaApi(GpuApi):
    prefix = "cuda"

    def __init__(self) -> None:
        self.mod = _import()
        self.register_flags = int(self.mod.cudaHostRegisterPortable) | int(self.mod.cudaHostRegisterMapped)
        self.h2d = self.mod.cudaMemcpyKind.cudaMemcpyHostToDevice

    def unavailable(self, err: Any) -> bool:
        return self.error_name(err) in _UNAVAILABLE

    def call(self, name: str, *args: Any) -> tuple[Any, ...]:
        try:
            return super().call(name, *args)
        except RuntimeError as exc:  # the bindings raise when libcudart/libcuda cannot be loaded at all
            raise RuntimeUnavailable(f"cuda: cannot load the CUDA libraries ({exc})",
                                     "install the NVIDIA driver / CUDA runtime, or use --runtime host/sim") from None


class CudaRuntime(CudaVmm, GpuRuntime):
    name = "cuda"

    def __init__(self) -> None:
        self.api = CudaApi()
