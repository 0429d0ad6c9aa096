"""Vendor GPU libraries (amdsmi, NVML): a lazy import that fails in one short clause, and guarded calls.

A failed import is remembered, so `--watch` does not try it again on every frame.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from collections.abc import Callable
from types import ModuleType

from ..errors import BackendUnavailable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any

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
    # The amdsmi wheel prints its complaint to stdout before raising KeyError('libamd_smi.so'), and
    # `status --json` must stay clean JSON.
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


class LibraryBackend:
    """What the library backends share: calls whose library errors read as None, and one shutdown."""

    _errors: tuple[type[BaseException], ...] = ()
    _shutdown: Callable[[], Any] | None = None  # set once the library is initialised

    def _try(self, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """One library call; an unsupported or failing query (the library's own errors) reads as None."""
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._errors:
            return None

    def close(self) -> None:
        shutdown, self._shutdown = self._shutdown, None
        self._try(shutdown)

    def __enter__(self) -> "LibraryBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
