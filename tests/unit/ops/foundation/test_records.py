"""gpuwarden.ops.foundation.records keeps @dataclass(frozen=True)'s behaviour (checked against real dataclasses side by side), and
gpuwarden.ops.foundation.lazyregex behaves as the compiled pattern it defers; both exist to keep `gpuwarden status` cheap to start."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re

import pytest

from gpuwarden.ops.foundation import model, records
from gpuwarden.ops.foundation.lazyregex import LazyRegex
from gpuwarden.ops.foundation.records import field, record


def _pair():
    """The same class body as a record and as a frozen dataclass."""
    def body(field):
        class Thing:
            """A thing."""
            pid: int
            name: str
            gpu: int | None = None
            vram: dict[int, int] = field(default_factory=dict)
            files: tuple[str, ...] = ()
            noise: float = field(default=0.0, compare=False, repr=False)
            seen: list = field(default_factory=list)

            def __post_init__(self):
                object.__setattr__(self, "files", tuple(self.files))

            @property
            def alive(self) -> bool:
                return self.pid > 0
        return Thing

    return record(body(field)), dataclasses.dataclass(frozen=True)(body(dataclasses.field))


def test_a_record_behaves_as_a_frozen_dataclass():
    rec, dc = _pair()
    for cls in (rec, dc):
        a = cls(1, "a", files=["x"])
        b = cls(pid=1, name="a", gpu=None, files=("x",), noise=5.0)
        assert a == b  # noise is not compared
        assert a != cls(2, "a") and a.files == ("x",) and a.alive
        assert a.vram == {} and a.vram is not cls(1, "a").vram  # a fresh dict per instance
        with pytest.raises(AttributeError):
            a.pid = 3
        with pytest.raises(AttributeError):
            del a.name
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls(1, "a", nope=1)
        with pytest.raises(TypeError):
            hash(cls(1, "a", vram={0: 1}))  # a dict field is unhashable, as with dataclasses
        assert a.__eq__(object()) is NotImplemented
        assert cls.__match_args__ == ("pid", "name", "gpu", "vram", "files", "noise", "seen")
    r, d = rec(3, "x", 1, {0: 5}), dc(3, "x", 1, {0: 5})
    assert repr(r) == repr(d).replace(dc.__qualname__, rec.__qualname__)
    assert r.__init__.__qualname__.endswith("Thing.__init__")


def test_dataclasses_functions_work_on_records():
    rec, dc = _pair()
    r = rec(3, "x", vram={0: 5})
    assert dataclasses.is_dataclass(r) and dataclasses.is_dataclass(rec)
    assert [(f.name, f.default, f.default_factory, f.compare, f.repr) for f in dataclasses.fields(rec)] == \
        [(f.name, f.default, f.default_factory, f.compare, f.repr) for f in dataclasses.fields(dc)]
    assert dataclasses.asdict(r) == dataclasses.asdict(dc(3, "x", vram={0: 5}))
    changed = dataclasses.replace(r, gpu=2)
    assert isinstance(changed, rec) and changed.gpu == 2 and changed.vram == {0: 5} and r.gpu is None
    assert records.replace(r, gpu=2) == changed
    with pytest.raises(TypeError):
        records.replace(r, nope=1)
    assert copy.deepcopy(r) == r
    holder = model.Holder(5, 1.5, "zombie", (0, 1), 1 << 20, detail="x")
    assert pickle.loads(pickle.dumps(holder)) == holder and copy.copy(holder) == holder
    assert hash(holder) == hash(model.Holder(5, 1.5, "zombie", (0, 1), 1 << 20, detail="x"))
    assert hash(holder) != hash(dataclasses.replace(holder, pid=6))


def test_a_record_without_fields():
    @record
    class Empty:
        def problem(self) -> None:
            return None

    assert Empty() == Empty() and hash(Empty()) == hash(Empty()) and repr(Empty()).endswith("Empty()")


def test_record_definition_errors_match_dataclasses():
    with pytest.raises(ValueError):
        @record
        class Bad:
            items: list = []  # noqa: RUF012
    with pytest.raises(TypeError):
        @record
        class Order:
            a: int = 1
            b: int


def test_every_model_record_lists_the_fields_dataclasses_sees():
    classes = [c for c in vars(model).values() if isinstance(c, type) and "__record_fields__" in c.__dict__]
    assert {c.__name__ for c in classes} >= {"GpuInfo", "GpuProcess", "Holder", "Residual", "NodeSnapshot"}
    for cls in classes:
        assert tuple(f.name for f in dataclasses.fields(cls)) == cls.__record_fields__
    # NodeSnapshot's __post_init__ still turns plain messages into warnings.
    snap = model.NodeSnapshot(1.0, "h", "sim", True, (), (), (), warnings=("SIMULATED x",))
    assert snap.warnings[0].code == "simulated"


def test_lazy_regex_compiles_at_first_use_and_matches_as_re_does():
    lazy = LazyRegex(r"(?i)tok(en)?=(\w+)")
    assert lazy.pattern == r"(?i)tok(en)?=(\w+)" and "search" not in vars(lazy)
    with pytest.raises(AttributeError):
        lazy.__deepcopy__  # noqa: B018 (probing hooks compiles nothing)
    assert "search" not in vars(lazy)
    compiled = re.compile(lazy.pattern)
    text = "a TOKEN=abc b tok=x"
    assert lazy.sub("<>", text) == compiled.sub("<>", text)
    assert "search" in vars(lazy) and lazy.search(text).group(2) == "abc"
    assert lazy.groups == compiled.groups and [m.span() for m in lazy.finditer(text)] == \
        [m.span() for m in compiled.finditer(text)]
