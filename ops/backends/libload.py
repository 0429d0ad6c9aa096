"""Imports a vendor GPU library lazily and turns every way that can fail into one short clause.

The amdsmi wheel prints to stdout and raises KeyError at import when libamd_smi.so is absent, so the
import runs with output captured; failures are remembered so `--watch` does not retry each frame.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from types import ModuleType

from ..errors import BackendUnavailable

_failed: dict[str, BackendUnavailable] = {}


def import_vendor(module_name: str, backend: str, library_missing: str, hint: str) -> ModuleType:
    """Import `module_name` or raise BackendUnavailable("<backend>: <clause>", hint).

    `library_missing` is the clause used when the package is installed but its shared library
    or driver is not (e.g. "libamd_smi.so not found").
    """
    if module_name in sys.modules:
        return sys.modules[module_name]
    if module_name in _failed:
        raise _failed[module_name]
    # The wheels write their own complaints to stdout; `status --json` must stay clean JSON.
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            failure = BackendUnavailable(f"{backend}: Python package {module_name} not installed", hint)
        else:
            failure = BackendUnavailable(f"{backend}: {library_missing}", hint)
    except Exception:  # KeyError, OSError, RuntimeError: all mean the native library did not load
        failure = BackendUnavailable(f"{backend}: {library_missing}", hint)
    _failed[module_name] = failure
    raise failure


def forget_failures() -> None:
    """Let the next import_vendor try again (tests; a library installed while running)."""
    _failed.clear()
