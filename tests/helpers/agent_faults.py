"""What several test files share with test_agent_faults.py: snapshot.

Taken out of test_agent_faults.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

from gpuwarden.ops.foundation.model import GpuInfo, NodeSnapshot


def snapshot(t: float, used: int) -> NodeSnapshot:
    gpu = GpuInfo(index=0, name="g", vendor="sim", vram_used=used, vram_total=8 << 30)
    return NodeSnapshot(taken_at=t, hostname="h", backend="sim", simulated=True, gpus=(gpu,), processes=(),
                        residual=())
