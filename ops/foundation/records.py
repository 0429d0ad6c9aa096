"""Frozen records for the modules `gpuwarden status` loads: @dataclass(frozen=True) at a fraction of its start-up cost.

dataclasses imports inspect (~7 ms) and compiles six methods per class at import (~0.7 ms a class); a record
compiles its __init__, __eq__ and __hash__ each at its first call, as fast as dataclasses' once made.
dataclasses.fields/replace/asdict/is_dataclass still work: they get real Field objects, made by dataclasses
itself the first time something asks (never on the status path).
"""

from __future__ import annotations

_MISSING = object()  # "no default" (dataclasses.MISSING, without importing dataclasses)
_FACTORY = object()  # the default of an argument whose value comes from a default_factory


class FrozenInstanceError(AttributeError):
    """An assignment to a record's field (records never change once made)."""


class Field:
    """What `field()` returns: a default or a default factory, and whether the field counts in ==, hash and repr."""

    __slots__ = ("default", "default_factory", "compare", "repr")

    def __init__(self, default: object, default_factory: object, compare: bool, repr: bool):
        self.default, self.default_factory, self.compare, self.repr = default, default_factory, compare, repr


def field(*, default: object = _MISSING, default_factory: object = _MISSING, compare: bool = True,
          repr: bool = True) -> Any:
    """dataclasses.field for a record (the options records support)."""
    if default is not _MISSING and default_factory is not _MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, compare, repr)


class _Spec:
    """One field of a record class, from its annotation and class attribute."""

    __slots__ = ("name", "annotation", "default", "factory", "compare", "repr")

    def __init__(self, name: str, annotation: object, value: object):
        self.name, self.annotation = name, annotation
        spec = value if isinstance(value, Field) else Field(value, _MISSING, True, True)
        self.default, self.factory = spec.default, spec.default_factory
        self.compare, self.repr = spec.compare, spec.repr


def _is_classvar(annotation: object) -> bool:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__qualname__", "")
    return text.startswith(("ClassVar", "typing.ClassVar"))


TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (records are on the `status` path)
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar, dataclass_transform

    _T = TypeVar("_T")
else:
    def dataclass_transform(**_kw):  # what typing's does at run time: nothing
        return lambda f: f


# To a type checker a record is a frozen dataclass: __init__ takes its fields, field() gives their defaults.
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[_T]) -> type[_T]:
    """The class as a frozen record: __init__ (then __post_init__), __repr__, __eq__, __hash__, no assignment."""
    if "__slots__" in cls.__dict__:
        raise TypeError(f"record {cls.__name__}: __slots__ is not supported")
    specs: dict[str, _Spec] = {}
    for base in reversed(cls.__mro__[1:]):
        for spec in base.__dict__.get("__record_specs__", ()):
            specs[spec.name] = spec
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, _MISSING)
        spec = specs[name] = _Spec(name, annotation, value)
        if spec.default is not _MISSING and type(spec.default).__hash__ is None:
            raise ValueError(f"mutable default {type(spec.default)} for field {name} is not allowed: "
                             "use default_factory")
        if isinstance(value, Field):  # the class keeps plain defaults (as dataclasses does), not the Field
            if spec.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, spec.default)
    fields = tuple(specs.values())
    made: Any = cls  # the attributes a record class gets, which type checkers learn from dataclass_transform
    made.__record_specs__ = fields
    made.__record_fields__ = tuple(s.name for s in fields)
    made.__match_args__ = made.__record_fields__  # type: ignore[misc]
    made.__dataclass_fields__ = _DataclassFields()
    _check_order(fields)
    # __init__, __eq__ and __hash__ are each compiled at their first call (dataclasses compiles six methods per class
    # at import, ~0.7 ms): until then stand-ins hold their places. The class's own methods win, as with dataclasses.
    explicit_hash = "__hash__" in cls.__dict__ and not (cls.__dict__["__hash__"] is None and "__eq__" in cls.__dict__)
    for name in ("__init__", "__eq__", "__hash__"):
        if name not in cls.__dict__ or (name == "__hash__" and not explicit_hash):
            type.__setattr__(cls, name, _stand_in(cls, name))
    _define(cls, "__repr__", _repr)
    made.__setattr__ = _frozen_setattr
    made.__delattr__ = _frozen_delattr
    return cls


def _define(cls: type, name: str, value: object) -> None:
    if name not in cls.__dict__:  # a method the class wrote itself wins, as with dataclasses
        setattr(cls, name, value)


def _check_order(fields: tuple[_Spec, ...]) -> None:
    seen_default = False
    for spec in fields:
        if spec.default is not _MISSING or spec.factory is not _MISSING:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {spec.name!r} follows default argument")


def _stand_in(cls: type, name: str) -> Callable[..., Any]:
    """`name` until its first call, which compiles the real method, puts it in place and calls it."""
    def method(self: object, *args: Any, **kwargs: Any) -> Any:
        real = _compile(cls, name)
        type.__setattr__(cls, name, real)
        return real(self, *args, **kwargs)
    method.__name__, method.__qualname__ = name, f"{cls.__qualname__}.{name}"
    return method


def _compile(cls: Any, name: str) -> Callable[..., Any]:
    """__init__, __eq__ or __hash__ from source, as dataclasses makes them: as fast as ones written by hand."""
    fields: tuple[_Spec, ...] = cls.__record_specs__
    ns: dict[str, object] = {"_FACTORY": _FACTORY, "_set": object.__setattr__}
    compared = [f"{{0}}.{s.name}," for s in fields if s.compare]
    if name == "__eq__":
        source = ("def __eq__(self, other):\n"
                  "    if other.__class__ is self.__class__:\n"
                  f"        return ({''.join(compared).format('self')}) == ({''.join(compared).format('other')})\n"
                  "    return NotImplemented\n")
    elif name == "__hash__":
        source = f"def __hash__(self):\n    return hash(({''.join(compared).format('self')}))\n"
    else:
        # object.__setattr__ (the class's own refuses), not self.__dict__[...]: asking for __dict__ would make
        # every later attribute read of the instance take the slower path of a materialised dict.
        params, body = ["self"], []
        for spec in fields:
            field_name = spec.name
            if spec.factory is not _MISSING:
                ns[f"_f_{field_name}"] = spec.factory
                params.append(f"{field_name}=_FACTORY")
                body.append(f"    _set(self, {field_name!r}, _f_{field_name}() if {field_name} is _FACTORY "
                            f"else {field_name})")
                continue
            if spec.default is not _MISSING:
                ns[f"_d_{field_name}"] = spec.default
                params.append(f"{field_name}=_d_{field_name}")
            else:
                params.append(field_name)
            body.append(f"    _set(self, {field_name!r}, {field_name})")
        if hasattr(cls, "__post_init__"):
            body.append("    self.__post_init__()")
        source = f"def __init__({', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, ns)  # noqa: S102 (our own source, from the class's field names)
    method: Any = ns[name]
    method.__qualname__ = f"{cls.__qualname__}.{name}"
    return method  # type: ignore[no-any-return]


def _repr(self: object) -> str:
    cls: Any = type(self)
    parts = ", ".join(f"{s.name}={getattr(self, s.name)!r}" for s in cls.__record_specs__ if s.repr)
    return f"{cls.__qualname__}({parts})"


def _frozen_setattr(self: object, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


class _DataclassFields:
    """A record's __dataclass_fields__, made on first use by dataclasses from a twin of the class."""

    def __get__(self, obj: object, cls: Any) -> dict[str, Any]:
        # deferred: keeps `gpuwarden status --json` cheap (6.9 ms there)
        import dataclasses
        # A docstring spares dataclasses an inspect.signature() of the twin (~2 ms) to write one.
        ns: dict[str, object] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                 "__doc__": cls.__doc__ or cls.__name__,
                                 "__annotations__": {s.name: s.annotation for s in cls.__record_specs__}}
        for s in cls.__record_specs__:
            if s.factory is not _MISSING or not s.compare or not s.repr:
                ns[s.name] = dataclasses.field(
                    **({"default_factory": s.factory} if s.factory is not _MISSING else
                       {} if s.default is _MISSING else {"default": s.default}), compare=s.compare, repr=s.repr)
            elif s.default is not _MISSING:
                ns[s.name] = s.default
        twin: Any = dataclasses.dataclass(frozen=True)(type(cls.__name__, (), ns))
        fields: dict[str, Any] = twin.__dataclass_fields__
        type.__setattr__(cls, "__dataclass_fields__", fields)
        type.__setattr__(cls, "__dataclass_params__", twin.__dataclass_params__)
        return fields


def field_names(cls: type) -> tuple[str, ...]:
    """A record class's field names in __init__'s order: record() sets them on the class, out of a checker's sight."""
    made: Any = cls
    names: tuple[str, ...] = made.__record_fields__
    return names


def replace(obj: _T, /, **changes: object) -> _T:
    """A copy of a record with some fields changed (dataclasses.replace without importing dataclasses)."""
    names = type(obj).__record_fields__  # type: ignore[attr-defined]
    unknown = set(changes).difference(names)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    return type(obj)(**{n: changes[n] if n in changes else getattr(obj, n) for n in names})
