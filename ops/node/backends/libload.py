"""Vendor GPU libraries (amdsmi, NVML): a lazy import that fails in one short clause, and guarded calls.

A failed import is remembered, so `--watch` does not try it again on every frame. Every call runs under the
settings' read deadline (gpuwarden.ops.foundation.deadline): one lane per GPU for its readings, one for the process lists,
one for opening; a call that does not answer leaves that GPU STALE, named by the call.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import importlib
import io
import sys
import time
from collections.abc import Callable
from types import ModuleType

from gpuwarden.ops.foundation.deadline import DEFAULT_S, LANES, LateRead, Lanes
from gpuwarden.ops.foundation.errors import BackendUnavailable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): the backends `status` tries on every node load this
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
    """What the library backends share: calls whose library errors read as None, calls under the read deadline,
    and one shutdown."""

    name = "library"
    _errors: tuple[type[BaseException], ...] = ()
    _shutdown: Callable[[], Any] | None = None  # set once the library is initialised
    deadline_s: float = DEFAULT_S
    _lanes: Lanes = LANES
    late: tuple[LateRead, ...] = ()  # late reads of the last refresh that belong to no one GPU
    _marks: dict[int, Callable[..., None]] = {}  # worker thread -> its lane's mark (set per instance when used)
    _last_usage: list[Any] = []

    # Errors by which the library says "this device never answers this query" (NVML's NotSupported: a fan
    # query on a passively cooled H200). Such a call is not made again: on the H200 the fan query's error path
    # was a sixth of the console's CPU. Subclasses set it once the library is loaded.
    _unsupported: tuple[type[BaseException], ...] = ()
    _never: set[tuple[Any, ...]] = set()
    _never_since = 0.0
    NEVER_FOR_S = 600.0  # then ask again: a mode change (MIG on or off) can make a query answer again

    def _deadlines(self, settings: Any) -> None:
        self.deadline_s = getattr(settings, "read_timeout_s", DEFAULT_S)
        self._marks = {}
        self._last_usage = []
        self._never = set()
        self._never_since = time.monotonic()

    def _try(self, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """One library call; an unsupported or failing query (the library's own errors) reads as None."""
        if fn is None:
            return None
        mark = self._marks.get(_thread.get_ident()) if self._marks else None
        if mark is not None:
            mark(getattr(fn, "__name__", None) or "a library call")  # what a late answer names
        # A library's handles are ctypes pointers, which do not hash: they are known by identity (the backend
        # keeps each handle for its lifetime, so the identity stays the handle's).
        key = (fn, *(a if isinstance(a, (int, str, float, bytes)) else id(a) for a in args))
        if key in self._never:
            return None
        try:
            return fn(*args)
        except self._unsupported:
            self._never.add(key)
            return None
        except self._errors:
            return None

    def _in_lane(self, read: Callable[[], Any]) -> Callable[[Callable[..., None]], Any]:
        """`read` as a lane's job: the calls it makes through _try say their names to the lane."""
        def job(mark: Callable[..., None]) -> Any:
            me = _thread.get_ident()
            self._marks[me] = mark
            try:
                return read()
            finally:
                self._marks.pop(me, None)
        return job

    def _opening(self, read: Callable[[], Any]) -> Any:
        """read() (the library's init and static facts) under the deadline; BackendUnavailable when it is late."""
        try:
            return self._lanes.run((self.name, "open"), self._in_lane(read), self.deadline_s, source=self.name)
        except LateRead as late:
            raise BackendUnavailable(f"{self.name}: {late.message}",
                                     "look for driver errors in `dmesg`; --read-timeout gives slow calls longer") from None

    def _gpus_in_lanes(self, items: list[tuple[int, Any]], read_one: Callable[[int, Any], Any],
                       stale_one: Callable[[int, LateRead], Any]) -> list[Any]:
        """read_one(index, handle) for every GPU at once, each in its lane, under one deadline; a late GPU is
        stale_one(index, late) (its static facts and the late call)."""
        if self._never and time.monotonic() - self._never_since > self.NEVER_FOR_S:
            self._never, self._never_since = set(), time.monotonic()
        jobs = [((self.name, "gpu", i), self._in_lane(functools.partial(read_one, i, h)), self.name, i)
                for i, h in items]
        out: list[Any] = []
        for (i, _), answer in zip(items, self._lanes.run_all(jobs, self.deadline_s)):
            if isinstance(answer, LateRead):
                out.append(stale_one(i, answer))
            elif isinstance(answer, BaseException):
                raise answer
            else:
                out.append(answer)
        return out

    def _usage_in_lane(self, read: Callable[[], list[Any]]) -> list[Any]:
        """The process lists under the deadline; when late, the last complete answer (and `late` names the call)."""
        usage, self.late = self._lanes.latest((self.name, "processes"), self._in_lane(read), self.deadline_s,
                                              self._last_usage, source=self.name)
        self._last_usage = usage
        return usage

    def close(self) -> None:
        shutdown, self._shutdown = self._shutdown, None
        if shutdown is None:
            return
        if _thread.get_ident() in self._marks:  # a failed open, in its own lane already
            self._try(shutdown)
            return
        try:  # a shutdown that hangs on a wedged GPU is left behind, like any late call
            self._lanes.run((self.name, "open"), self._in_lane(lambda: self._try(shutdown)), self.deadline_s,
                            source=self.name)
        except LateRead:
            pass

    def __enter__(self) -> "LibraryBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
