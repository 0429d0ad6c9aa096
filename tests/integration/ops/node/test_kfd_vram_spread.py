"""KFD per-process VRAM without every vram file every refresh: a GPU whose device VRAM moved has all its files
re-read at once, the others in turns, so a change the device figure does not show is seen within VRAM_SPREAD."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpuwarden.ops.node.backends.sysfs import SysfsBackend
from gpuwarden.ops.node.sim.node import SimNode

MiB = 1 << 20


@pytest.fixture
def node_and_procs(state_dir):
    node = SimNode(state_dir)
    node.init(gpus=2, vram=8 << 30)
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(16)]
    try:
        node.allocate_many([(p.pid, i % 2, 64 * MiB) for i, p in enumerate(procs)])
        yield node, procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _refresh(backend: SysfsBackend) -> dict[tuple[int, int], int]:
    backend.gpus()  # as Attribution.sample does: the device figures first, the signal for the files
    return {(u.pid, u.gpu_index): u.vram_bytes for u in backend.process_usage()}


def _vram_file(node: SimNode, pid: int, gpu: int) -> str:
    return str(node.sysfs_root / "class/kfd/kfd/proc" / str(pid) / f"vram_{node.gpu_id(gpu)}")


def test_a_steady_refresh_reads_a_fraction_of_the_vram_files(node_and_procs, monkeypatch):
    node, procs = node_and_procs
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    try:
        for _ in range(3):
            _refresh(backend)
        assert backend._repeat is not None
        kfd_fds = set(backend._repeat[1])
        assert len(kfd_fds) == 16
        reads: list[int] = []
        real = os.pread
        monkeypatch.setattr(os, "pread", lambda fd, n, at: (reads.append(fd), real(fd, n, at))[1])
        covered: set[int] = set()
        steady = 0
        for _ in range(2 * SysfsBackend.VRAM_SPREAD):
            reads.clear()
            assert len(_refresh(backend)) == 16
            if backend._refreshes % SysfsBackend.RELIST_EVERY == 0:
                continue  # the relisting pass reads every file (new GPUs of a known process)
            mine = [fd for fd in reads if fd in kfd_fds]
            # 8 files a GPU, 2 GPUs: one of each GPU's 8 in turn, not all 16
            assert len(mine) <= 2, len(mine)
            covered.update(mine)
            steady += 1
        assert steady >= SysfsBackend.VRAM_SPREAD and covered == kfd_fds  # every file read within the spread
    finally:
        backend.close()


def test_an_allocation_is_seen_at_the_next_refresh_and_a_hidden_change_within_the_spread(node_and_procs):
    node, procs = node_and_procs
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    try:
        for _ in range(3):
            _refresh(backend)
        # An allocation moves the GPU's mem_info_vram_used: that GPU's files are all read at the next refresh.
        node.allocate(procs[4].pid, 0, 32 * MiB)
        assert _refresh(backend)[(procs[4].pid, 0)] == 96 * MiB
        for _ in range(3):
            _refresh(backend)
        # A change with the device figure unchanged (another process freed as much): only the rotation sees it.
        pid = procs[6].pid
        fd = os.open(_vram_file(node, pid, 0), os.O_RDWR)
        try:
            os.pwrite(fd, f"{80 * MiB:<23d}\n".encode(), 0)
        finally:
            os.close(fd)
        seen_after = None
        for n in range(1, SysfsBackend.VRAM_SPREAD + 1):
            if _refresh(backend)[(pid, 0)] == 80 * MiB:
                seen_after = n
                break
            # while it is not seen, the answer says how old its oldest figure can be
            assert backend.vram_checked_at is not None
        assert seen_after is not None, "not seen within VRAM_SPREAD refreshes"
    finally:
        backend.close()


def test_without_the_device_signal_every_file_is_read(node_and_procs):
    """process_usage() alone (doctor, a caller that did not read the GPUs first) skips nothing."""
    node, procs = node_and_procs
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    try:
        backend.process_usage()
        pid = procs[2].pid
        fd = os.open(_vram_file(node, pid, 0), os.O_RDWR)
        try:
            os.pwrite(fd, f"{70 * MiB:<23d}\n".encode(), 0)
        finally:
            os.close(fd)
        assert {(u.pid, u.gpu_index): u.vram_bytes for u in backend.process_usage()}[(pid, 0)] == 70 * MiB
    finally:
        backend.close()


def test_the_compact_json_is_the_document_with_every_process_and_load(node_and_procs, state_dir):
    """to_json writes the processes from their cached JSON (with the load joined once per pair): the same document
    as to_dict, the first time and again from the caches, and it carries how old the per-process figures are."""
    import json

    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.sampling.sampler import Sampler
    node, procs = node_and_procs
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    sampler = Sampler(Settings(state_dir=state_dir), backend, deep_every_s=1e9, process_load=True)
    try:
        sampler.snapshot(deep=True)
        snap = sampler.snapshot(deep=False)
        assert snap.process_load and len(snap.processes) == 16
        for _ in range(2):
            assert json.loads(snap.to_json()) == json.loads(json.dumps(snap.to_dict()))
        gpu = json.loads(snap.to_json())["gpus"][0]
        assert gpu["processes_vram_checked_at"] <= snap.taken_at and gpu["processes_vram_checked_at_iso"]
    finally:
        sampler.close()


def test_directories_are_listed_again_only_when_a_device_figure_moves_unexplained(node_and_procs, monkeypatch):
    """Steady refreshes list only the KFD proc directory (not 16 PID directories every RELIST_EVERY); a known
    process's first VRAM on another GPU (a new vram file, the device figure moved, no held file did) is seen at
    the refresh after next at the latest."""
    node, procs = node_and_procs
    backend = SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root)
    try:
        for _ in range(3):
            _refresh(backend)
        listed: list[str] = []
        real = os.listdir
        monkeypatch.setattr(os, "listdir", lambda p: (listed.append(str(p)), real(p))[1])
        for _ in range(2 * SysfsBackend.RELIST_EVERY):
            _refresh(backend)
        kfd = str(node.sysfs_root / "class/kfd/kfd/proc")
        assert [p for p in listed if p.startswith(kfd + "/")] == []
        pid = procs[0].pid  # on GPU 0 only
        node.allocate(pid, 1, 8 * MiB)
        seen = [_refresh(backend).get((pid, 1)) for _ in range(2)]
        assert seen[-1] == 8 * MiB, seen
    finally:
        backend.close()
