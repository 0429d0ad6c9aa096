"""The residual arithmetic of gpuwarden.ops.sampling.attribution, case by case: device used - what live
processes account for - the idle baseline, the tolerance that separates noise from a tenant's leftovers,
and which processes become holders (zombies, disk sleep, PIDs the driver charges that no longer exist)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.ops.foundation.model import GpuInfo, GpuProcess
from gpuwarden.ops.sampling.attribution import (
    TOLERANCE_FRACTION, TOLERANCE_NO_BASELINE, TOLERANCE_WITH_BASELINE, Attribution,
)
from gpuwarden.ops.foundation.settings import Settings

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def attribution(tmp_path: Path) -> Attribution:
    """Attribution over an empty /proc (residual() reads nothing of the node; the backend is not asked)."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "status").write_text("Name:\tpytest\nNSpid:\t1\n")
    settings = Settings(state_dir=tmp_path / "state", config_path=tmp_path / "node.toml", proc_root=proc)
    a = Attribution(settings, backend=None, use_pidfds=False)  # type: ignore[arg-type]
    yield a
    a.close()


def gpu(index: int, used: int | None, total: int = 24 * GiB) -> GpuInfo:
    return GpuInfo(index=index, name="t", vendor="sim", vram_total=total, vram_used=used,
                   device_files=(f"/dev/dri/renderD{128 + index}",))


def proc(pid: int, state: str, vram: dict[int, int], source: str = "kfd", files: tuple[str, ...] = (),
         ppid: int | None = 1) -> GpuProcess:
    return GpuProcess(pid=pid, start_time=1.0, user="u", command=f"p{pid}", state=state, ppid=ppid,
                      vram=vram, sources={g: source for g in vram}, device_files=files)


# (case, device used, processes, baseline, expected residual, significant, holder reasons)
CASES = [
    ("idle GPU, no baseline", 100 * MiB, [], None, 100 * MiB, False, []),
    ("a live process explains everything", 10 * GiB, [proc(10, "running", {0: 10 * GiB})], None, 0, False, []),
    ("live processes and their sum", 12 * GiB, [proc(10, "sleeping", {0: 4 * GiB}), proc(11, "running", {0: 7 * GiB})],
     None, 1 * GiB, True, []),
    ("the baseline is subtracted", 1 * GiB, [], 900 * MiB, 124 * MiB, False, []),
    ("just under the no-baseline tolerance", TOLERANCE_NO_BASELINE, [], None, TOLERANCE_NO_BASELINE, False, []),
    ("just over the no-baseline tolerance", TOLERANCE_NO_BASELINE + 1, [], None, TOLERANCE_NO_BASELINE + 1, True,
     []),
    ("a baseline tightens the tolerance", 1 * GiB, [], 1 * GiB - TOLERANCE_WITH_BASELINE - 1,
     TOLERANCE_WITH_BASELINE + 1, True, []),
    ("a zombie's VRAM is residual, the zombie its holder", 14 * GiB, [proc(20, "zombie", {0: 14 * GiB}, ppid=7)],
     None, 14 * GiB, True, ["zombie"]),
    ("disk sleep cannot free: residual with a holder", 3 * GiB, [proc(21, "disk-sleep", {0: 3 * GiB})], None,
     3 * GiB, True, ["disk-sleep"]),
    ("the driver charges a PID that is gone", 2 * GiB, [proc(22, "gone", {0: 2 * GiB})], None, 2 * GiB, True,
     ["kfd-without-process"]),
    ("a holder by device file only", 5 * GiB, [proc(23, "zombie", {}, files=("/dev/dri/renderD128",))], None,
     5 * GiB, True, ["zombie"]),
    ("negative residual: processes report more than the device", 1 * GiB, [proc(10, "running", {0: 2 * GiB})],
     None, -1 * GiB, False, []),
    ("device used unknown: residual unknown", None, [], None, None, False, []),
]


@pytest.mark.parametrize("case, used, processes, baseline, want, significant, reasons", CASES,
                         ids=[c[0] for c in CASES])
def test_residual_arithmetic(attribution, case, used, processes, baseline, want, significant, reasons):
    (res,), warnings = attribution.residual((gpu(0, used),), tuple(processes),
                                            {} if baseline is None else {0: baseline})
    assert res.residual == want
    assert res.significant is significant
    assert sorted(h.reason for h in res.holders) == sorted(reasons)
    accounted = sum(p.vram.get(0, 0) for p in processes if p.state in ("running", "sleeping"))
    assert res.accounted == accounted
    leak = [w for w in warnings if w.code == "ownerless-leak"]
    assert bool(leak) == (significant and not reasons), warnings


def test_the_tolerance_grows_with_the_card(attribution):
    """On a 192 GiB card 1% (about 1.9 GiB) is noise: the fixed tolerances would cry wolf."""
    total = 192 * GiB
    noise = int(total * TOLERANCE_FRACTION)
    (quiet,), _ = attribution.residual((gpu(0, noise, total),), (), {})
    (loud,), _ = attribution.residual((gpu(0, noise + 1, total),), (), {})
    assert (quiet.significant, loud.significant) == (False, True)


def test_a_share_the_driver_did_not_give_makes_residual_unknown(attribution):
    """NVML without root reports some processes' VRAM as unknown: the difference would blame the wrong thing."""
    p = proc(30, "running", {0: 0}, source="nvml-unknown")
    (res,), warnings = attribution.residual((gpu(0, 10 * GiB),), (p,), {})
    assert res.residual is None and not res.significant
    assert [w.code for w in warnings] == ["residual-unknown"]


def test_a_kfd_only_holder_is_shared_by_every_gpu(attribution):
    """A zombie that holds only /dev/kfd could pin any GPU: every GPU lists it."""
    z = proc(40, "zombie", {}, files=("/dev/kfd",))
    out, _ = attribution.residual((gpu(0, 3 * GiB), gpu(1, 3 * GiB)), (z,), {})
    assert [[h.pid for h in r.holders] for r in out] == [[40], [40]]


def test_per_gpu_accounting_keeps_gpus_apart(attribution):
    p = proc(50, "running", {0: 4 * GiB, 1: 1 * GiB})
    out, _ = attribution.residual((gpu(0, 4 * GiB), gpu(1, 9 * GiB)), (p,), {1: 0})
    assert [(r.accounted, r.residual, r.significant) for r in out] == [(4 * GiB, 0, False),
                                                                       (1 * GiB, 8 * GiB, True)]
