"""Shared pieces of the Kubernetes tests: the API-server stand-in as a fixture, snapshots to feed the
reconciler, and a clock the tests move by hand.
"""

from __future__ import annotations

import pytest

from ops.model import GpuInfo, Holder, NodeSnapshot, Residual
from standins.kube_apiserver import FakeApiServer

NODE = "gpu-node-1"
GiB = 1 << 30


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def api():
    server = FakeApiServer().start()
    server.add_node(NODE)
    yield server
    server.stop()


def snapshot(residual: dict[int, int] | None = None, holders: dict[int, list[Holder]] | None = None,
             gpus: int = 4, drained: tuple[int, ...] = ()) -> NodeSnapshot:
    """A node of `gpus` AMD-shaped GPUs; residual bytes and holders per GPU index."""
    residual, holders = residual or {}, holders or {}
    g = tuple(GpuInfo(index=i, name="sim", vendor="amd", bus_id=f"0000:{0x10 + i:02x}:00.0", uuid=f"uuid-{i}",
                      vram_total=24 * GiB, vram_used=residual.get(i, 0)) for i in range(gpus))
    res = tuple(Residual(gpu_index=i, device_used=residual.get(i, 0), accounted=0, baseline=0,
                         residual=residual.get(i, 0), holders=tuple(holders.get(i, ())),
                         significant=residual.get(i, 0) > GiB // 2) for i in range(gpus))
    return NodeSnapshot(taken_at=0.0, hostname=NODE, backend="sim", simulated=True, gpus=g, processes=(),
                        residual=res, drained=drained)
