"""The parts of the simulated node's tree that `gpuwarden doctor` reads: a healthy MI300X-shaped platform.

PCIe links at their maximum (Gen5 x16), large BAR, one NUMA node, equal firmware, RAS counters at zero, amdgpu
parameters at their defaults, XGMI links when the node is a hive. Firmware values are a real MI300X's as
`rocm-smi -a` printed them (shared/fixtures/rocm-smi/rocm_smi_showallinfo_a_4x_mi300x.txt), written in the
sysfs form "0x%08x" (MEC 138, RLC 63, SDMA 19, SMC 00.85.91.00, SOS 0x0036024b, VCN 0x0611300c). Drills plant
faults by editing these files (a link at x8, one GPU's firmware changed, an uncorrectable RAS count).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation import statedir

FIRMWARE = {"mec_fw_version": 0x8A, "mec2_fw_version": 0x8A, "rlc_fw_version": 0x3F, "sdma_fw_version": 0x13,
            "sdma2_fw_version": 0x13, "smc_fw_version": 0x00555B00, "sos_fw_version": 0x0036024B,
            "vcn_fw_version": 0x0611300C}
VBIOS = "113-MI3SRIOV-001\n"
RAS_BLOCKS = ("umc", "gfx", "sdma", "mmhub", "pcie_bif", "xgmi_wafl", "hdp")
PARAMETERS = {"gpu_recovery": "-1", "lockup_timeout": "", "no_system_mem_limit": "N", "gttsize": "-1",
              "ras_enable": "-1"}
LINK = {"current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe", "current_link_width": "16",
        "max_link_width": "16"}
XGMI, PCIE = 11, 2
# MI300X's DPM levels (MHz): engine clock up to 2100, HBM3 memory clock up to 1300; the board is passively
# cooled (no fan1_input/pwm1) and capped at 750 W (hwmon power1_cap, microwatts).
SCLK_LEVELS = (500, 1300, 2100)
MCLK_LEVELS = (900, 1100, 1300)
POWER_CAP_UW = 750_000_000
# hwmon sensor labels in amdgpu's order (temp1 edge, temp2 junction, temp3 mem).
TEMP_LABELS = ("edge", "junction", "mem")


def dpm_table(levels: tuple[int, ...], current: int) -> str:
    """pp_dpm_sclk/pp_dpm_mclk as amdgpu prints them: "<level>: <clock>Mhz " with "*" on the level in use."""
    return "".join(f"{i}: {mhz}Mhz {'*' if i == current else ''}\n" for i, mhz in enumerate(levels))


def _put(path: Path, text: str, root: Path) -> None:
    # Through the state dir's checked opens: nothing planted in the sim tree redirects a write.
    statedir.atomic_write(path, text if text.endswith("\n") else text + "\n", 0o644, root=root)


def _io_link(path: Path, kind: int, node_from: int, node_to: int, root: Path) -> None:
    weight = 15 if kind == XGMI else 20
    _put(path, f"type {kind}\nversion_major 0\nversion_minor 0\nnode_from {node_from}\nnode_to {node_to}\n"
               f"weight {weight}\nmin_latency 0\nmax_latency 0\nmin_bandwidth 0\nmax_bandwidth 0\n"
               "recommended_transfer_size 0\nflags 1\n", root)


# MI300X compute partition modes -> logical GPUs per physical device (one per XCD in CPX).
PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}


def write(sysfs_root: Path, gpus: int, vram: int, hive: bool, partition: str = "SPX") -> None:
    # A tree this module makes (the sim node's, a test's): its root may be new, with its parents. The checked
    # opens below refuse to create more than one missing level, which guards a mistyped --state-dir.
    sysfs_root.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1
    for name, value in PARAMETERS.items():
        _put(sysfs_root / "module/amdgpu/parameters" / name, value, sysfs_root)
    _put(sysfs_root / "module/ttm/parameters/pages_limit", str((os.sysconf("SC_PHYS_PAGES") or 0) // 2), sysfs_root)
    topo = sysfs_root / "class/kfd/kfd/topology/nodes"
    for i in range(gpus):
        dev = sysfs_root / "class/drm" / f"card{i}" / "device"
        for name, value in LINK.items():
            _put(dev / name, value, sysfs_root)
        _put(dev / "mem_info_vis_vram_total", str(vram), sysfs_root)
        for n, label in enumerate(TEMP_LABELS, 1):
            _put(dev / "hwmon/hwmon0" / f"temp{n}_label", label, sysfs_root)
        _put(dev / "hwmon/hwmon0/power1_cap", str(POWER_CAP_UW), sysfs_root)
        _put(dev / "hwmon/hwmon0/power1_cap_max", str(POWER_CAP_UW), sysfs_root)
        _put(dev / "numa_node", "0", sysfs_root)
        # MI300X's defaults: one partition per device (SPX), memory interleaved over the whole HBM (NPS1); NPS4
        # (a quarter of the HBM per NUMA domain) goes only with CPX.
        _put(dev / "current_compute_partition", partition, sysfs_root)
        _put(dev / "current_memory_partition", "NPS4" if partition == "CPX" else "NPS1", sysfs_root)
        _put(dev / "local_cpulist", f"0-{cpus - 1}" if cpus > 1 else "0", sysfs_root)
        _put(dev / "revision", "0x00", sysfs_root)
        _put(dev / "vbios_version", VBIOS, sysfs_root)
        for fw, version in FIRMWARE.items():
            _put(dev / "fw_version" / fw, f"0x{version:08x}", sysfs_root)
        for block in RAS_BLOCKS:
            _put(dev / "ras" / f"{block}_err_count",
                 "ue: 0\nce: 0\nde: 0\n" if block == "umc" else "ue: 0\nce: 0\n", sysfs_root)
        _put(dev / "ras" / "gpu_vram_bad_pages", "", sysfs_root)
        node = i + 1
        links = topo / str(node) / "io_links"
        _io_link(links / "0" / "properties", PCIE, node, 0, sysfs_root)
        if hive:
            for k, peer in enumerate(p + 1 for p in range(gpus) if p != i):
                _io_link(links / str(k + 1) / "properties", XGMI, node, peer, sysfs_root)
