"""The one validating loader of gpuwarden's state files: each file's shape, checked on every read.

A file of the wrong shape is a StateFileError naming the file and what is wrong; callers that can
carry on (a corrupt baseline is no baseline) turn it into a warning instead of a traceback.
"""

from __future__ import annotations

import math
from pathlib import Path
from gpuwarden.ops.foundation import statedir
from gpuwarden.ops.foundation.records import record
from gpuwarden.ops.foundation.statedir import StateFileError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Protocol

    from gpuwarden.ops.foundation.filecache import FileCache

    class Shape(Protocol):
        """What every shape below is: it says what is wrong with a parsed JSON value, or None."""

        def problem(self, v: Any) -> str | None: ...


# --- shapes ------------------------------------------------------------------------------------

@record
class Num:
    """A JSON number (not a bool), finite, within [lo, hi]."""
    lo: float = -math.inf
    hi: float = math.inf
    integer: bool = False

    def problem(self, v: Any) -> str | None:
        ok_type = int if self.integer else (int, float)
        if isinstance(v, bool) or not isinstance(v, ok_type):
            return f"{_show(v)} is not {'a whole number' if self.integer else 'a number'}"
        if isinstance(v, float) and not math.isfinite(v):
            return f"{v} is not a finite number"
        if not self.lo <= v <= self.hi:
            return f"{v} is out of range [{self.lo:g}, {self.hi:g}]"
        return None


INT = Num(integer=True)
COUNT = Num(0, 2**63, integer=True)
PID = Num(1, 2**22, integer=True)
TIME = Num(0, 1e11)


@record
class Str:
    max_len: int = 4096

    def problem(self, v: Any) -> str | None:
        if not isinstance(v, str):
            return f"{_show(v)} is not a string"
        return None if len(v) <= self.max_len else f"a string of {len(v)} characters (at most {self.max_len})"


STR = Str()


@record
class Bool:
    def problem(self, v: Any) -> str | None:
        return None if isinstance(v, bool) else f"{_show(v)} is not true/false"


@record
class Opt:
    """The shape, or null."""
    inner: Shape

    def problem(self, v: Any) -> str | None:
        return None if v is None else self.inner.problem(v)


@record
class ListOf:
    item: Shape
    max_len: int = 100_000

    def problem(self, v: Any) -> str | None:
        if not isinstance(v, list):
            return f"{_show(v)} is not a list"
        if len(v) > self.max_len:
            return f"a list of {len(v)} items (at most {self.max_len})"
        for i, x in enumerate(v):
            p = self.item.problem(x)
            if p:
                return f"[{i}]: {p}"
        return None


@record
class MapOf:
    """An object whose keys match `key` (e.g. a GPU index as a string) and values `value`."""
    value: Shape
    key: str = "any"  # "any" or "index" (a string of digits)

    def problem(self, v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"{_show(v)} is not an object"
        for k, x in v.items():
            if self.key == "index" and not (k.isdigit() and len(k) < 6):
                return f"key {k!r} is not a GPU index"
            p = self.value.problem(x)
            if p:
                return f"{k}: {p}"
        return None


@record
class Obj:
    """An object with these keys (all optional unless listed in `required`); other keys are allowed."""
    fields: dict[str, Shape]
    required: tuple[str, ...] = ()

    def problem(self, v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"{_show(v)} is not an object"
        for k in self.required:
            if k not in v:
                return f"no {k!r}"
        for k, shape in self.fields.items():
            if k in v:
                p = shape.problem(v[k])
                if p:
                    return f"{k}: {p}"
        return None


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# --- the state files ---------------------------------------------------------------------------

DRAINED = MapOf(Obj({"since": TIME, "who": STR, "reason": STR}), key="index")
BASELINE = Obj({"gpus": MapOf(Obj({"vram_bytes": COUNT, "recorded_at": TIME, "backend": STR}, ("vram_bytes",)),
                              key="index")}, ("gpus",))
ENGINE_STATE = Obj({
    "name": STR, "gpu": Opt(COUNT), "phase": Str(64), "detail": Opt(STR),
    "pid": Opt(PID), "pid_start": Opt(COUNT), "shim_pid": Opt(PID), "shim_start": Opt(COUNT),
    "started_at": Opt(TIME), "exit_code": Opt(INT), "signal": Opt(Str(64)), "core_dumped": Opt(Bool()),
    "restarts": COUNT, "bundle": Opt(STR), "phases": MapOf(TIME), "gate_slot": Opt(COUNT),
    "stopped_by_request": Opt(Bool()), "updated_at": Opt(TIME), "launch_id": Opt(STR), "warning": Opt(STR),
    # What the engine's status lines said of its register calls: loosely, the engine writes most of it.
    "registrations": ListOf(Obj({"kind": Str(32), "outcome": Str(32)}), 100_000),
    # The KFD ledger (gpuwarden.ops.engines.ledger): pinned host memory and failed calls, from the interposer.
    "host_ledger": Obj({"pinned_bytes": COUNT, "peak_bytes": COUNT, "failed": COUNT, "processes": MapOf(Obj({})),
                        "failures": ListOf(Obj({}), 1000), "calls": ListOf(Obj({}), 1000)}),
})
ENGINE_SPEC = Obj({
    "engine": Obj({"name": Str(64), "argv": ListOf(STR, 4096), "gpu": Opt(COUNT), "env": MapOf(STR),
                   "workdir": Opt(STR), "progress": Str(64), "stop_signal": Str(32),
                   "stop_grace": Num(0, 1e7), "restart": Str(32), "log_max": Num(4096, 2**50, integer=True),
                   "start_limit_burst": Num(1, 1e6, integer=True), "gated": Bool()}, ("name", "argv")),
    "gate_dir": STR, "gate_slots": Num(1, 4096, integer=True), "registration_timeout": Num(0, 1e7),
    "workdir": Opt(STR), "visibility": MapOf(STR), "launch_id": Opt(STR),
}, ("engine",))
LOCK_INFO = Obj({"pid": PID, "who": Str(256), "what": Str(256), "time": Str(64)})
SLOT_INFO = Obj({"pid": PID, "who": Str(256), "since": TIME})
JOURNAL_ENTRY = Obj({"ts": TIME, "time": Str(64), "who": Str(256), "action": Str(256), "result": Str(64)},
                    ("action",))
SIM_NODE = Obj({"gpus": Num(1, 64, integer=True), "vram": COUNT, "gtt": COUNT, "idle_used": COUNT,
                "hive": Bool(), "faults": ListOf(Str(64), 16), "leaked": MapOf(COUNT, key="index"),
                "resets": MapOf(COUNT, key="index"), "kfd_limit": Opt(COUNT)}, ("gpus", "vram", "gtt"))
SIM_ALLOC = Obj({"pid": PID, "ticks": COUNT, "gpu": Num(0, 63, integer=True), "bytes": COUNT},
                ("pid", "ticks", "gpu", "bytes"))
# The simulated driver's DRM clients: one record per (process, fd) that shows a client (a forked child that kept
# the fd shows the same client id), ops/node/sim/drm.py.
SIM_DRM = Obj({"clients": ListOf(Obj({"pid": PID, "ticks": COUNT, "fd": Num(0, 1 << 20, integer=True),
                                       "gpu": Num(0, 63, integer=True), "client": COUNT, "busy": Num(0, 1),
                                       "opened": TIME, "vram": COUNT}, ("pid", "ticks", "fd", "gpu", "client")),
                              1 << 16)}, ("clients",))
SCENARIO = Obj({"name": Str(64), "ts": TIME, "engines": ListOf(Str(64), 64), "files": ListOf(STR, 64),
                "config": STR, "processes": ListOf(Obj({"pid": PID, "ticks": COUNT, "what": Str(256),
                                                        "reaps": ListOf(PID, 64)}, ("pid", "ticks")), 64)},
               ("name",))
REGISTRATION = Obj({"pid": PID, "start_ticks": Opt(COUNT), "gpu": Num(0, 1 << 16, integer=True), "bytes": COUNT,
                    "address": STR, "arena": Opt(STR), "chunks": COUNT, "since": TIME,
                    "kind": Opt(STR), "call": Opt(STR)},
                   ("pid", "gpu", "bytes"))


def problem(value: Any, shape: Shape) -> str | None:
    """What is wrong with `value` for `shape`, or None."""
    return shape.problem(value)


def check(value: Any, shape: Shape, path: Path | str) -> Any:
    """`value` when it has the shape; else a StateFileError naming the file and the first wrong thing."""
    p = shape.problem(value)
    if p:
        raise StateFileError(path, p)
    return value


def load(path: Path, shape: Shape, default: Any = None, *, root: Path) -> Any:
    """Read a JSON state file and check its shape; missing gives `default`."""
    data = statedir.read_bytes(path, root=root)
    if data is None:
        return default
    return check(statedir.parse_json(data, path), shape, path)


def parse(data: bytes, shape: Shape, path: Path | str) -> Any:
    """Parse and check bytes already read (from a locked fd, say)."""
    return check(statedir.parse_json(data, path), shape, path)


def load_cached(path: Path, shape: Shape, default: Any = None, *, root: Path, cache: "FileCache | None" = None) -> Any:
    """`load`, through a sampler's FileCache when there is one (a refresh parses a file only when it changed)."""
    if cache is not None:
        # Cached values are shared between callers: they must not change what they get.
        return cache.get(path, lambda p: load(p, shape, default, root=root), f"state:{id(shape)}", missing=default)
    return load(path, shape, default, root=root)
