"""The agent's warning before KFD's system-memory limit: an event when use crosses 90% of it, one when it drops."""

from __future__ import annotations

from dataclasses import replace

from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.sampling.changes import KINDS, diff

GiB = 1 << 30


def snap(used: int, at: float) -> NodeSnapshot:
    base = NodeSnapshot.__new__(NodeSnapshot)
    fields = {f: None for f in NodeSnapshot.__dataclass_fields__}
    fields.update(taken_at=at, hostname="n", backend="sim", simulated=False, gpus=(), processes=(), engines=(),
                  residual=(), warnings=(), drained=(),
                  driver={"kfd_mem_limit": {"system_used": used, "system_limit": int(121.5 * GiB)}})
    try:
        return NodeSnapshot(**fields)
    except TypeError:
        return replace(base, **fields)


def test_crossing_90_percent_warns_with_the_numbers_and_dropping_back_says_so():
    low, high = snap(100 * GiB, 1.0), snap(112 * GiB, 2.0)
    events = [e for e in diff(low, high) if e.kind.startswith("kfd-")]
    assert len(events) == 1 and events[0].level == "warning" and events[0].kind in KINDS
    assert "112.0/121.5 GiB" in events[0].text and "hipHostMalloc" in events[0].text
    assert "`gpuwarden engines list`" in events[0].text  # what confirms who holds it
    assert not [e for e in diff(high, snap(113 * GiB, 3.0)) if e.kind.startswith("kfd-")]  # said once
    back = [e for e in diff(high, snap(90 * GiB, 4.0)) if e.kind.startswith("kfd-")]
    assert [e.kind for e in back] == ["kfd-limit-ok"]
