"""The names of the error codes a host-registration call returns, per runtime, for what gpuwarden says about it.

The interposer records only the number; "error 101" means nothing at 3 a.m., "hipErrorInvalidDevice" does.
"""

from __future__ import annotations

# The codes hipHostRegister, cudaHostRegister and cuMemHostRegister document or are seen to return, from each
# runtime's public headers (hip_runtime_api.h hipError_t, driver_types.h cudaError, cuda.h CUresult).
HIP = {1: "hipErrorInvalidValue", 2: "hipErrorOutOfMemory", 3: "hipErrorNotInitialized",
       4: "hipErrorDeinitialized", 35: "hipErrorInsufficientDriver", 100: "hipErrorNoDevice",
       101: "hipErrorInvalidDevice", 201: "hipErrorInvalidContext", 709: "hipErrorContextIsDestroyed",
       712: "hipErrorHostMemoryAlreadyRegistered", 713: "hipErrorHostMemoryNotRegistered",
       801: "hipErrorNotSupported", 999: "hipErrorUnknown"}
CUDART = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 3: "cudaErrorInitializationError",
          4: "cudaErrorCudartUnloading", 35: "cudaErrorInsufficientDriver", 100: "cudaErrorNoDevice",
          101: "cudaErrorInvalidDevice", 201: "cudaErrorDeviceUninitialized",
          712: "cudaErrorHostMemoryAlreadyRegistered", 713: "cudaErrorHostMemoryNotRegistered",
          801: "cudaErrorNotSupported", 999: "cudaErrorUnknown"}
DRIVER = {1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
          4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
          201: "CUDA_ERROR_INVALID_CONTEXT", 712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
          713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", 801: "CUDA_ERROR_NOT_SUPPORTED", 999: "CUDA_ERROR_UNKNOWN"}


def name(call: object, code: object) -> str | None:
    """The runtime's name for `code` as returned by `call` (hipHostRegister, cudaHostRegister, cuMemHostRegister...);
    None when unknown. Both come from an engine's status events as it sent them: anything but a str call names no
    runtime."""
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    fn = call if isinstance(call, str) else ""
    table = HIP if fn.startswith("hip") else CUDART if fn.startswith("cuda") else \
        DRIVER if fn.startswith("cu") else None
    return table.get(code) if table else None


def describe(call: object, code: object) -> str:
    """'hipErrorInvalidDevice (101)', or 'error 1061' when the name is not known."""
    known = name(call, code)
    return f"{known} ({code})" if known else f"error {code}"
