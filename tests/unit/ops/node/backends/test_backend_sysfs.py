"""The sysfs/KFD backend against trees made of captured amdgpu and KFD files."""

from __future__ import annotations

import pytest

from gpuwarden.ops.node.backends.fdinfo import parse, totals
from gpuwarden.ops.node.backends.sysfs import SysfsBackend, bdf_from_location, parse_properties
from gpuwarden.ops.foundation.errors import BackendUnavailable
from helpers.sysfs_tree import add_card, add_kfd_node, add_kfd_proc


def test_properties_of_a_real_strix_halo_node(fixtures):
    props = parse_properties((fixtures / "sysfs/kfd_topology_node1_properties_strix_halo_gfx1151_truncated.txt").read_text())
    assert props["gfx_target_version"] == 110501
    assert props["drm_render_minor"] == 128
    assert props["location_id"] == 49664 and props["domain"] == 0
    # 49664 = 0xc200: bus 0xc2, device 0, function 0
    assert bdf_from_location(props["domain"], props["location_id"]) == "0000:c2:00.0"


def test_card_and_kfd_node_joined_by_render_minor(tmp_path, fixtures):
    f = fixtures / "sysfs"
    add_card(tmp_path, 1, vram_total=(f / "amdgpu_mem_info_vram_total_8gb_card.txt").read_text(),
             vram_used=(f / "amdgpu_mem_info_vram_used_8gb_card.txt").read_text(), render_minor=128)
    add_kfd_node(tmp_path, 0, 0, (f / "kfd_topology_node0_properties_carrizo_apu_rocm1.x_2017.txt").read_text())
    add_kfd_node(tmp_path, 1, 53123, (f / "kfd_topology_node1_properties_strix_halo_gfx1151_truncated.txt").read_text(),
                 name="gfx1151")
    add_kfd_proc(tmp_path, 4242, 53123, 6 << 30)
    add_kfd_proc(tmp_path, 4243, 99999, 1 << 30)  # a gpu_id that is not on this node: ignored
    b = SysfsBackend(sysfs_root=tmp_path, dev_root=tmp_path / "dev")
    [gpu] = b.gpus()
    assert gpu.vram_total == 8573157376 and gpu.vram_used == 6812925952
    assert gpu.kfd_gpu_id == 53123
    assert gpu.bus_id == "0000:c2:00.0"  # from KFD, the card has no uevent here
    assert gpu.name == "AMD GPU gfx1151"
    assert gpu.device_files == (str(tmp_path / "dev/dri/renderD128"),)
    usage = b.process_usage()
    assert [(u.pid, u.gpu_index, u.vram_bytes, u.source) for u in usage] == [(4242, 0, 6 << 30, "kfd")]


def test_old_kernel_node_without_render_minor_joins_by_bus(tmp_path, fixtures):
    props = (fixtures / "sysfs/kfd_topology_node0_properties_carrizo_apu_rocm1.x_2017.txt").read_text()
    # location_id 8 = bus 0, device 1, function 0
    add_card(tmp_path, 0, vram_total="1073741824\n", vram_used="0\n", bus="0000:00:01.0")
    add_kfd_node(tmp_path, 0, 7, props)
    [gpu] = SysfsBackend(sysfs_root=tmp_path).gpus()
    assert gpu.bus_id == "0000:00:01.0" and gpu.vram_total == 1 << 30 and gpu.kfd_gpu_id == 7


def test_kfd_order_decides_indexes(tmp_path):
    for card, (minor, _gid) in enumerate([(129, 2002), (128, 1001)]):
        add_card(tmp_path, card, vram_total=f"{(card + 1) << 30}\n", vram_used="0\n", render_minor=minor)
    add_kfd_node(tmp_path, 1, 1001, "drm_render_minor 128\n")
    add_kfd_node(tmp_path, 2, 2002, "drm_render_minor 129\n")
    gpus = SysfsBackend(sysfs_root=tmp_path).gpus()
    assert [(g.index, g.kfd_gpu_id, g.vram_total) for g in gpus] == [(0, 1001, 2 << 30), (1, 2002, 1 << 30)]


def test_cpu_only_kfd_says_why(tmp_path):
    # The captured `ls -lR` shows a KFD topology with a single CPU node (gpu_id 0).
    add_kfd_node(tmp_path, 0, 0, "cpu_cores_count 8\n")
    with pytest.raises(BackendUnavailable, match="sysfs: no amdgpu card and no KFD GPU node"):
        SysfsBackend(sysfs_root=tmp_path)
    with pytest.raises(BackendUnavailable, match="sysfs: no .*class/kfd"):
        SysfsBackend(sysfs_root=tmp_path / "nothing")


def test_fdinfo_new_format(fixtures):
    c = parse((fixtures / "fdinfo/amdgpu_fdinfo_drm_print_memory_stats_format_2024.txt").read_text())
    assert c.client_key == "id:30" and c.pdev == "0000:04:00.0" and c.driver == "amdgpu"
    assert c.vram_bytes == 544428 * 1024
    assert c.gtt_bytes == 22528 * 1024  # "drm-memory-gtt: \t22528 KiB": a space before the TAB


def test_fdinfo_igpu_gtt_heavy(fixtures):
    c = parse((fixtures / "fdinfo/amdgpu_fdinfo_grep_drm_memory_890m_llama_server_gtt_heavy.txt").read_text())
    assert c.vram_bytes == 5348 * 1024 and c.gtt_bytes == 25258000 * 1024


def test_fdinfo_old_format_and_dedup(fixtures):
    text = (fixtures / "fdinfo/amdgpu_fdinfo_old_format_kernel5.15.txt").read_text()
    c = parse(text)
    assert c.vram_bytes == 17196 * 1024 and c.gtt_bytes == 6144 * 1024
    assert c.client_key == "pasid:0000:04:00.0:32774"
    # the same client seen through two fds counts once
    assert totals([c, parse(text)]) == {"0000:04:00.0": (17196 * 1024, 6144 * 1024)}


def test_fdinfo_not_drm():
    assert parse("pos:\t0\nflags:\t02\nmnt_id:\t3\n") is None


def test_a_reloaded_driver_is_followed_not_read_through_old_descriptors(tmp_path):
    """A driver reload removes and re-adds every card and KFD node (here: the tree rebuilt, the card renumbered);
    the held descriptors of the old files must not go on reporting the old numbers."""
    import shutil
    add_card(tmp_path, 0, vram_total=f"{24 << 30}\n", vram_used="0\n", render_minor=128)
    add_kfd_node(tmp_path, 1, 1001, "drm_render_minor 128\n")
    b = SysfsBackend(sysfs_root=tmp_path)
    assert [g.vram_used for g in b.gpus()] == [0]
    assert [g.vram_used for g in b.gpus()] == [0]  # read twice: now through held descriptors
    shutil.rmtree(tmp_path / "class")
    add_card(tmp_path, 1, vram_total=f"{24 << 30}\n", vram_used=f"{14 << 30}\n", render_minor=129)
    add_kfd_node(tmp_path, 1, 2002, "drm_render_minor 129\n")
    add_kfd_proc(tmp_path, 4242, 2002, 3 << 30)
    [gpu] = b.gpus()
    assert (gpu.vram_used, gpu.kfd_gpu_id) == (14 << 30, 2002)
    assert [(u.pid, u.vram_bytes) for u in b.process_usage()] == [(4242, 3 << 30)]


def test_a_file_replaced_by_rename_is_read_again(tmp_path):
    import os
    dev = add_card(tmp_path, 0, vram_total=f"{24 << 30}\n", vram_used="0\n")
    b = SysfsBackend(sysfs_root=tmp_path)
    assert b.gpus()[0].vram_used == 0
    (dev / "new").write_text(f"{2 << 30}\n")
    os.replace(dev / "new", dev / "mem_info_vram_used")
    assert b.gpus()[0].vram_used == 2 << 30
