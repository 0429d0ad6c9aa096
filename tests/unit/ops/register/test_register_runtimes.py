"""Registration runtimes in-process: host really pins and unpins, sim records and forgets, chunking, visibility.

hip and cuda cannot run here (no GPU); their missing-library line is checked in test_canary.py.
"""

from __future__ import annotations


import pytest

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.register import get
from gpuwarden.ops.register.base import physical_gpu, split
from gpuwarden.ops.register.host import locked_bytes

MiB = 1 << 20


@pytest.fixture
def arena(tmp_path):
    from gpuwarden.ops.arena.create import create
    from gpuwarden.ops.arena.mapping import MappedArena
    create(tmp_path / "a.arena", size=4 * MiB, chunk_size=MiB)
    with MappedArena(tmp_path / "a.arena") as m:
        yield m


def test_host_pins_then_unpins(arena):
    rt = get("host")
    rt.open(0)
    before = locked_bytes()
    reg = rt.register(arena.payload_address, arena.payload_size, chunk_size=MiB)
    assert len(reg.chunks) == 4 and reg.device_address is None
    assert locked_bytes() - before >= 4 * MiB
    copy = rt.copy_to_device(reg, MiB)
    assert copy.bytes == 4 * MiB and copy.gbps > 0
    rt.unregister(reg)
    assert locked_bytes() == before and reg.chunks == []


def test_sim_records_registration_with_a_device_address(arena, state_dir, monkeypatch):
    from gpuwarden.ops.node.sim import registrations
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    rt = get("sim", state_dir=state_dir)
    rt.open(0)
    reg = rt.register(arena.payload_address, arena.payload_size, path=arena.path)
    assert reg.gpu == 2
    assert reg.device_address is not None and reg.device_address != reg.host_address
    (rec,) = registrations.list_all(state_dir)
    assert rec["gpu"] == 2 and rec["bytes"] == 4 * MiB and rec["arena"] == arena.path and not rec["stale"]
    rt.unregister(reg)
    assert registrations.list_all(state_dir) == []


def test_split_and_visibility():
    assert split(4096, 10 * 4096, None) == [(4096, 10 * 4096)]
    assert split(0, 10 * 4096, 4 * 4096) == [(0, 16384), (16384, 16384), (32768, 8192)]
    with pytest.raises(GpuwardenError):
        split(0, 10 * 4096, 1000)
    assert physical_gpu(0, {}) == 0
    assert physical_gpu(0, {"CUDA_VISIBLE_DEVICES": "3"}) == 3
    assert physical_gpu(1, {"HIP_VISIBLE_DEVICES": "1,2", "ROCR_VISIBLE_DEVICES": "4,5,6"}) == 6


def test_unknown_runtime_is_one_line():
    with pytest.raises(GpuwardenError, match="unknown runtime 'opencl'"):
        get("opencl")
