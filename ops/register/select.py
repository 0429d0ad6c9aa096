"""Choosing a registration runtime by name: a registry of (module, class), imported only when asked for.

Like gpuwarden.ops.node.backends.select: base.py defines the interface, the implementations import base, and only
this module names them, so nothing imports in a circle and `host` never pays for hip-python.
"""

from __future__ import annotations

import importlib
from typing import Callable

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.register.base import RUNTIMES, Runtime

# name -> (module, class); options (e.g. the sim runtime's state dir) go to the class.
_IMPLS = {
    "hip": ("gpuwarden.ops.register.hip", "HipRuntime"),
    "cuda": ("gpuwarden.ops.register.cuda", "CudaRuntime"),
    "host": ("gpuwarden.ops.register.host", "HostRuntime"),
    "sim": ("gpuwarden.ops.register.sim", "SimRuntime"),
}
assert tuple(sorted(_IMPLS)) == tuple(sorted(RUNTIMES))


def get(name: str, **options: object) -> Runtime:
    """The runtime called `name`; imports its library only now."""
    if name not in _IMPLS:
        raise GpuwardenError(f"unknown runtime {name!r}", f"choose one of: {', '.join(RUNTIMES)}")
    module_name, cls_name = _IMPLS[name]
    cls: Callable[..., Runtime] = getattr(importlib.import_module(module_name), cls_name)  # options differ per runtime
    return cls(**options) if options else cls()
