"""The host runtime: pin the arena with mlock(2), no GPU needed; reports RLIMIT_MEMLOCK when it is too low.

Pinning is what a GPU registration does to the pages first, so this reproduces its memory side anywhere.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource

from gpuwarden.ops.foundation.units import fmt_bytes

from gpuwarden.ops.register.base import DEFAULT_COPY_BUFFER, CopyResult, RegisterFailed, Registration, Runtime, host_copy

CAP_IPC_LOCK = 14


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("mlock", "munlock"):
        fn = getattr(libc, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return libc


def has_ipc_lock() -> bool:
    """True when this process may lock memory past RLIMIT_MEMLOCK (CAP_IPC_LOCK in its effective set)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def memlock_limit() -> int | None:
    """The soft RLIMIT_MEMLOCK in bytes; None for unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def locked_bytes(pid: int | str = "self") -> int:
    """VmLck of a process: bytes it has locked right now."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit_hint() -> str:
    return ("raise it: `ulimit -l unlimited` in the shell, LimitMEMLOCK=infinity in a systemd unit, "
            "--ulimit memlock=-1 for docker, or grant CAP_IPC_LOCK")


class HostRuntime(Runtime):
    name = "host"

    def __init__(self) -> None:
        self._c = _libc()

    def register(self, address: int, size: int, *, chunk_size: int | None = None,
                 path: str | None = None) -> Registration:
        limit = memlock_limit()
        if limit is not None and size > limit and not has_ipc_lock():
            raise RegisterFailed(
                f"host: cannot pin {fmt_bytes(size)}: RLIMIT_MEMLOCK is {fmt_bytes(limit)} ({limit} bytes) "
                f"and this process lacks CAP_IPC_LOCK", _limit_hint())
        return super().register(address, size, chunk_size=chunk_size, path=path)

    def _register_one(self, address: int, size: int, reg: Registration) -> None:
        if self._c.mlock(ctypes.c_void_p(address), ctypes.c_size_t(size)) != 0:
            err = ctypes.get_errno()
            limit = memlock_limit()
            shown = "unlimited" if limit is None else f"{fmt_bytes(limit)} ({limit} bytes)"
            if err in (errno.ENOMEM, errno.EPERM):
                raise RegisterFailed(
                    f"host: mlock of {fmt_bytes(size)} failed ({os.strerror(err)}); RLIMIT_MEMLOCK is {shown}, "
                    f"{fmt_bytes(locked_bytes())} already locked by this process", _limit_hint())
            raise RegisterFailed(f"host: mlock of {fmt_bytes(size)} failed ({os.strerror(err)})",
                                 "the kernel could not lock the pages; check free RAM")

    def _unregister_one(self, address: int, size: int, reg: Registration) -> None:
        if self._c.munlock(ctypes.c_void_p(address), ctypes.c_size_t(size)) != 0:
            raise RegisterFailed(f"host: munlock failed ({os.strerror(ctypes.get_errno())})")

    def _device_address(self, reg: Registration) -> int | None:
        return None  # no device: nothing may use these pages but the host

    def copy_to_device(self, reg: Registration, buffer_size: int = DEFAULT_COPY_BUFFER) -> CopyResult:
        return host_copy(reg.host_address, reg.size, buffer_size)
