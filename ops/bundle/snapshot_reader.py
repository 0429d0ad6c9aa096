"""A snapshot.json from a bundle (anyone's), read strictly: every field checked against the model's types.

The model's dataclasses are the shape: a wrong type, a missing required field or a non-finite number
is a ValueError naming where; every string is made printable (a stranger's bundle may carry escapes).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import TYPE_CHECKING, Any, TypeVar

from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.foundation.safetext import printable

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")
MAX_ITEMS = 100_000  # GPUs, processes, holders...: far more than any node has


def read_snapshot(data: Any) -> NodeSnapshot:
    """The NodeSnapshot `data` describes, or ValueError("processes[3].vram: ...")."""
    return _dataclass(data, NodeSnapshot, "snapshot")


def clean(snap: NodeSnapshot) -> NodeSnapshot:
    """The same snapshot with every string printable (for trees read from a bundle)."""
    return read_snapshot(snap.to_dict())


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against the type form `hint` (what typing.get_type_hints gives for a model field)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        problems = []
        for option in args:
            try:
                return _check(value, option, where)
            except ValueError as exc:
                problems.append(str(exc))
        raise ValueError(problems[0])
    if hint is type(None):
        if value is None:
            return None
        raise ValueError(f"{where}: {_show(value)} where null belongs")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: {_show(value)} is not true/false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{where}: {_show(value)} is not a whole number")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value) if isinstance(value, float) else value
        raise ValueError(f"{where}: {_show(value)} is not a finite number")
    if hint is str:
        if isinstance(value, str):
            return printable(value)
        raise ValueError(f"{where}: {_show(value)} is not a string")
    if origin is tuple:
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise ValueError(f"{where}: {_show(value)} is not a list")
        item = args[0]
        return tuple(_check(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict) or len(value) > MAX_ITEMS:
            raise ValueError(f"{where}: {_show(value)} is not an object")
        key_type, value_type = args
        out = {}
        for k, v in value.items():
            if key_type is int:
                if not (isinstance(k, str) and k.isdigit() and len(k) < 10):
                    raise ValueError(f"{where}: key {_show(k)} is not an index")
                key: Any = int(k)
            else:
                key = printable(k)
            out[key] = _check(v, value_type, f"{where}.{printable(str(k))}")
        return out
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(value, hint, where)
    raise ValueError(f"{where}: cannot check a {hint!r}")  # a model type this reader does not know yet


def _dataclass(value: Any, cls: type[D], where: str) -> D:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {_show(value)} is not an object")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            kwargs[f.name] = _check(value[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}: no {f.name!r}")
    return cls(**kwargs)


_hint_cache: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _hint_cache:
        # The model names Any in its annotations without importing typing (it would slow `status` down).
        _hint_cache[cls] = typing.get_type_hints(cls, localns={"Any": Any})
    return _hint_cache[cls]


def _show(value: Any) -> str:
    text = printable(repr(value))
    return text if len(text) <= 40 else text[:37] + "..."
