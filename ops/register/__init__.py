"""Registration runtimes: register the arena with one GPU (hip, cuda), pin it (host), or record it (sim).

`get(name)` returns one; see base.Runtime for the interface.
"""

from gpuwarden.ops.register.base import RUNTIMES, CopyResult, Registration, RegisterFailed, Runtime, RuntimeUnavailable
from gpuwarden.ops.register.select import get

__all__ = ["RUNTIMES", "CopyResult", "Registration", "RegisterFailed", "Runtime", "RuntimeUnavailable", "get"]
