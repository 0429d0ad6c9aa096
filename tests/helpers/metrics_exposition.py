"""What several test files share with test_metrics_exposition.py: make_reading, make_snapshot.

Taken out of test_metrics_exposition.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

from gpuwarden.ops.metrics.reading import PlanBudget, Reading
from gpuwarden.ops.foundation.model import ArenaInfo, ArenaMapper, EngineInfo, GpuInfo, Holder, NodeSnapshot, Residual


GiB = 1 << 30


NOW = 1_800_000_000.0


def _gpu(i: int) -> GpuInfo:
    return GpuInfo(index=i, name="AMD Instinct MI300X", vendor="amd", bus_id=f"0000:1{i}:00.0", uuid=f"u{i}",
                   vram_total=192 * GiB, vram_used=(20 + i) * GiB, gtt_total=64 * GiB, gtt_used=GiB,
                   busy_percent=50.0, temperature_c=40.0 + i, power_w=300.0)


def make_snapshot(gpus=(0, 1, 2), engines=True, processes=()) -> NodeSnapshot:
    zombie = Holder(pid=41, start_time=1.0, reason="zombie", gpus=(1,), vram_bytes=3 * GiB)
    dead = Holder(pid=42, start_time=None, reason="kfd-without-process", gpus=(1,), vram_bytes=GiB)
    files = Holder(pid=43, start_time=1.0, reason="disk-sleep", gpus=(1,), vram_bytes=None)
    residual = {
        0: Residual(0, 20 * GiB, 20 * GiB, None, 0),
        1: Residual(1, 21 * GiB, 17 * GiB, None, 4 * GiB, (zombie, dead, files), True),
        2: Residual(2, 22 * GiB, 8 * GiB, GiB, 13 * GiB, (), True),
    }
    eng = (
        EngineInfo("dp0", 0, "serving", pid=100, restarts=2, phase_since=NOW - 30, crashes={"SIGSEGV": 2}),
        EngineInfo("dp1", 1, "crashed", pid=101, signal="SIGBUS", phase_since=NOW - 5,
                   crashes={"SIGBUS": 1, "SIGUSR2": 1}),
    ) if engines else ()
    arena = ArenaInfo("/dev/shm/w", 64 * GiB, "ok", (ArenaMapper(100, "eng", None, None, True, 0),
                                                     ArenaMapper(101, "eng", None, None, False, 1)))
    return NodeSnapshot(taken_at=NOW, hostname="n1", backend="amdsmi", simulated=False,
                        gpus=tuple(_gpu(i) for i in gpus), processes=tuple(processes),
                        residual=tuple(residual[i] for i in gpus), engines=eng, arenas=(arena,),
                        drained=(2,), duration_s=0.012,
                        driver={"debugfs": "/sys/kernel/debug", "kfd_mem_limit_unavailable": None,
                                "kfd_mem_limit": {"system_used": 200 * GiB, "system_limit": 251 * GiB,
                                                  "ttm_used": 0, "ttm_limit": 0, "source": "kfd/mem_limit"},
                                "vram_free": [{"gpu": i, "allocator": "drm_buddy", "total": 192 * GiB,
                                               "free": 8 * GiB, "largest_free_block": 2 << 20,
                                               "free_blocks": 4096, "fragmentation": 0.9998} for i in gpus],
                                "vram_free_unavailable": None})


def make_reading(snap: NodeSnapshot, **kw) -> Reading:
    base = dict(mode="agent", age_s=0.4, residual_since={1: NOW - 90, 2: NOW - 400},
                findings={("gpu-page-fault", "error"): 3, ("segfault", "error"): 0}, now=NOW,
                plan=PlanBudget("/dev/shm/w", 4 * 64 * GiB * 8, 500 * GiB, False, False))
    base.update(kw)
    return Reading(snapshot=snap, **base)
