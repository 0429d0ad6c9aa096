"""Node trees for doctor tests: a healthy MI300X-shaped node (every root), and sysfs rebuilt from a captured rocm-smi -a.

The GPU side of the healthy node is the simulated driver's platform files (ops/node/sim/platform.py); host files use the
formats the kernel writes (the bracketed THP mode, /proc/swaps' header, /proc/mounts lines, `CONFIG_X=y`).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim import platform
from helpers.sysfs_tree import add_card, add_kfd_node, write

RELEASE = "6.8.0-52-generic"
OPTIONS = ("CONFIG_HMM_MIRROR", "CONFIG_MMU_NOTIFIER", "CONFIG_HSA_AMD", "CONFIG_DRM_AMDGPU_USERPTR",
           "CONFIG_ZONE_DEVICE", "CONFIG_DEVICE_PRIVATE", "CONFIG_HSA_AMD_SVM", "CONFIG_PCI_P2PDMA",
           "CONFIG_DMABUF_MOVE_NOTIFY", "CONFIG_HSA_AMD_P2P")
VRAM = 192 << 30


def healthy_node(base: Path, gpus: int = 4, *, rocm: str = "6.4.1-120", amdgpu: str | None = "6.12.12") -> Settings:
    """A node that passes every check that applies; returns Settings whose roots point at it."""
    sys_, proc, etc, boot, opt = (base / n for n in ("sys", "proc", "etc", "boot", "opt"))
    for i in range(gpus):
        add_card(sys_, i, vram_total=f"{VRAM}\n", vram_used="0\n", bus=f"0000:{0x11 + i:02x}:00.0",
                 render_minor=128 + i, extra={"device": "0x74a1\n", "product_name": "AMD Instinct MI300X OAM\n",
                                              "mem_info_gtt_total": f"{VRAM // 2}\n",
                                              "iommu_group/type": "identity\n"})
        add_kfd_node(sys_, i + 1, 50000 + i, f"gfx_target_version 90402\ndrm_render_minor {128 + i}\n"
                     f"location_id {(0x11 + i) << 8}\ndomain 0\nhive_id 1311768467463790320\n", "gfx942")
    platform.write(sys_, gpus, VRAM, hive=True)
    if amdgpu:
        write(sys_ / "module/amdgpu/version", f"{amdgpu}\n")
    write(sys_ / "kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n")
    write(sys_ / "kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never\n")
    write(sys_ / "kernel/mm/transparent_hugepage/shmem_enabled", "always within_size advise [never] deny force\n")
    write(sys_ / "devices/system/node/online", "0\n")
    (sys_ / "class/iommu/ivhd0").mkdir(parents=True)
    write(proc / "cmdline", f"BOOT_IMAGE=/vmlinuz-{RELEASE} root=/dev/sda1 ro iommu=pt\n")
    write(proc / "meminfo", "MemTotal:       2113396304 kB\nMemFree:        2000000000 kB\n"
          "SwapTotal:             0 kB\nSwapFree:              0 kB\n")
    write(proc / "swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n")
    write(proc / "sys/kernel/osrelease", f"{RELEASE}\n")
    write(proc / "sys/kernel/numa_balancing", "0\n")
    write(proc / "sys/vm/swappiness", "60\n")
    write(proc / "self/mounts", "tmpfs /dev/shm tmpfs rw,nosuid,nodev,inode64 0 0\n")
    write(proc / "cpuinfo", "processor\t: 0\nvendor_id\t: AuthenticAMD\n")
    write(boot / f"config-{RELEASE}", "".join(f"{o}=y\n" for o in OPTIONS) + "# CONFIG_DRM_NOUVEAU is not set\n")
    write(etc / "security/limits.conf", "# /etc/security/limits.conf\n*               soft    core            0\n")
    if rocm:
        write(opt / "rocm/.info/version", f"{rocm}\n")
    state = base / "state"
    state.mkdir(exist_ok=True)
    return Settings(state_dir=state, config_path=state / "node.toml", sysfs_root=sys_, proc_root=proc,
                    etc_root=etc, boot_root=boot, opt_root=opt)


def gzip_config(settings: Settings) -> None:
    """Move the kernel config from /boot to /proc/config.gz (a kernel with CONFIG_IKCONFIG_PROC)."""
    path = settings.boot_root / f"config-{RELEASE}"
    (settings.proc_root / "config.gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()


def from_rocm_smi(root: Path, capture: Path) -> dict[str, object]:
    """Rebuild the sysfs files a `rocm-smi -a` report was read from: the amdgpu module version, each card's PCI
    device id and revision, VBIOS and firmware. Returns what it found (for the test's expectations)."""
    text = capture.read_text()
    driver = re.search(r"^Driver version: (\S+)", text, re.M)
    if driver:
        write(root / "module/amdgpu/version", f"{driver[1]}\n")
    cards: dict[int, dict[str, str]] = {}
    for m in re.finditer(r"^GPU\[(\d+)\]\s+: (.+?):\s+(.+)$", text, re.M):
        gpu, key, value = int(m[1]), m[2].strip(), m[3].strip()
        files = cards.setdefault(gpu, {})
        if key == "Device ID":
            files["device"] = value
        elif key == "Device Rev":
            files["revision"] = value
        elif key == "VBIOS version":
            files["vbios_version"] = value
        elif key == "Card series":
            files["product_name"] = value
        elif key.endswith(" firmware version"):
            block = key[:-len(" firmware version")].lower().replace(" ", "_")
            files[f"fw_version/{block}_fw_version"] = value
    for gpu, files in cards.items():
        add_card(root, gpu, vram_total=f"{VRAM}\n", vram_used="0\n", extra={k: f"{v}\n" for k, v in files.items()})
    return {"driver": driver[1] if driver else None, "cards": cards}
