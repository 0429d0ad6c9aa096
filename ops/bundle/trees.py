"""Copy the raw files the backends read (sysfs, KFD, DRM fdinfo, /proc) into the bundle's tree/.

The layout under tree/sys and tree/proc mirrors the node, so replay points the sysfs backend and
the process reader at it and gets the node as it was. Files that do not exist are skipped quietly;
files that exist but cannot be read are recorded with the reason.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
from pathlib import Path

from gpuwarden.ops.node.procs import ProcReader
from gpuwarden.ops.bundle.entries import DENIED, FAILED, Entry

READ_LIMIT = 256 << 10  # one sysfs/proc file
MAPS_LIMIT = 8 << 20

DRM_DEVICE_FILES = (
    "vendor", "device", "subsystem_vendor", "subsystem_device", "revision", "uevent", "product_name",
    "product_number", "serial_number", "unique_id", "vbios_version", "mem_info_vram_total", "mem_info_vram_used",
    "mem_info_vis_vram_total", "mem_info_vis_vram_used", "mem_info_gtt_total", "mem_info_gtt_used",
    "mem_info_vram_vendor", "gpu_busy_percent", "mem_busy_percent", "current_link_speed", "current_link_width",
    "max_link_speed", "max_link_width", "power_dpm_force_performance_level", "pp_dpm_sclk", "pp_dpm_mclk",
    "reset_method", "numa_node", "local_cpulist",
)
HWMON_FILES = ("name", "temp1_input", "temp2_input", "temp3_input", "power1_average", "power1_input", "power1_cap")
KFD_NODE_FILES = ("gpu_id", "name", "properties")
PROC_FILES = ("stat", "status", "cmdline", "environ", "maps", "limits", "cgroup")
NODE_PROC_FILES = ("stat", "uptime", "meminfo", "cmdline", "version", "self/status", "sys/kernel/core_pattern",
                   "driver/nvidia/version")


def read_file(path: Path, limit: int = READ_LIMIT) -> tuple[bytes | None, str | None, str | None]:
    """(data, status-if-failed, error). Missing files give (None, None, None): nothing to report."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not hang the collector
        try:
            return os.read(fd, limit), None, None
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None, None, None
    except PermissionError as exc:
        return None, DENIED, exc.strerror
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None, None, None
        return None, FAILED, exc.strerror or str(exc)


def _ls(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class TreeCopier:
    """Accumulates entries for files copied from a root into `prefix` (e.g. tree/sys)."""

    def __init__(self, collector: str, root: Path, prefix: str):
        self.collector, self.root, self.prefix = collector, root, prefix
        self.entries: list[Entry] = []

    def file(self, rel: str, *, environ: bool = False, cmdline: bool = False, limit: int = READ_LIMIT) -> bytes | None:
        src = self.root / rel
        data, status, error = read_file(src, limit)
        if data is not None:
            self.entries.append(Entry(self.collector, str(src), "file", path=f"{self.prefix}/{rel}", data=data,
                                      environ=environ, cmdline=cmdline))
        elif status:
            self.entries.append(Entry(self.collector, str(src), "file", status=status, error=error))
        return data

    def dir(self, rel: str) -> None:
        self.entries.append(Entry(self.collector, str(self.root / rel), "dir", path=f"{self.prefix}/{rel}", data=b""))

    def link(self, rel: str, target: str) -> None:
        self.entries.append(Entry(self.collector, str(self.root / rel), "link", path=f"{self.prefix}/{rel}",
                                  data=b"", link=target, redact=False))


def copy_sysfs(sysfs_root: Path) -> list[Entry]:
    t = TreeCopier("sysfs", sysfs_root, "tree/sys")
    drm = sysfs_root / "class/drm"
    for card in _ls(drm):
        if not re.fullmatch(r"card\d+", card):
            continue
        dev = f"class/drm/{card}/device"
        for name in DRM_DEVICE_FILES:
            t.file(f"{dev}/{name}")
        for sub in _ls(sysfs_root / dev / "drm"):
            if sub.startswith("renderD") or sub.startswith("card"):
                t.dir(f"{dev}/drm/{sub}")
        for hw in _ls(sysfs_root / dev / "hwmon"):
            for name in HWMON_FILES:
                t.file(f"{dev}/hwmon/{hw}/{name}")
        for name in _ls(sysfs_root / dev / "ras"):
            t.file(f"{dev}/ras/{name}")
        if (sysfs_root / dev / "devcoredump").exists():
            t.dir(f"{dev}/devcoredump")  # presence only: the dump itself is large and binary
    topo = "class/kfd/kfd/topology"
    t.file(f"{topo}/generation_id")
    t.file(f"{topo}/system_properties")
    for node in _ls(sysfs_root / topo / "nodes"):
        for name in KFD_NODE_FILES:
            t.file(f"{topo}/nodes/{node}/{name}")
    for pid in _ls(sysfs_root / "class/kfd/kfd/proc"):
        for name in _ls(sysfs_root / "class/kfd/kfd/proc" / pid):
            if name.startswith("vram_") or name in ("pasid",):
                t.file(f"class/kfd/kfd/proc/{pid}/{name}")
    for mod in ("amdgpu", "nvidia"):
        t.file(f"module/{mod}/version")
        for name in _ls(sysfs_root / "module" / mod / "parameters"):
            t.file(f"module/{mod}/parameters/{name}")
    return t.entries


def kfd_pids(sysfs_root: Path) -> set[int]:
    return {int(p) for p in _ls(sysfs_root / "class/kfd/kfd/proc") if p.isdigit()}


def gpu_device_globs(dev_roots: list[Path]) -> list[str]:
    out = []
    for root in dev_roots:
        out += [str(root / "kfd"), str(root / "dri" / "renderD*"), str(root / "dri" / "card*"),
                str(root / "nvidia*")]
    return out


def find_holders(proc_root: Path, globs: list[str]) -> tuple[set[int], int]:
    """PIDs holding a GPU device file open, and how many processes' fds we were not allowed to read."""
    reader = ProcReader(proc_root)
    holders, denied = set(), 0
    me = os.getpid()
    for pid in reader.pids():
        if pid == me:
            continue
        fd_dir = proc_root / str(pid) / "fd"
        try:
            os.listdir(fd_dir)
        except PermissionError:
            denied += 1
            continue
        except OSError:
            continue
        if reader.open_files(pid, globs):
            holders.add(pid)
    return holders, denied


def copy_proc(proc_root: Path, pids: set[int], globs: list[str]) -> list[Entry]:
    t = TreeCopier("proc", proc_root, "tree/proc")
    for rel in NODE_PROC_FILES:
        t.file(rel)
    for pid in sorted(pids):
        base = str(pid)
        if t.file(f"{base}/stat") is None:
            continue  # gone since it was listed
        for name in PROC_FILES[1:]:
            # maps of a big engine run to megabytes, and the GPU libraries sit anywhere in them
            t.file(f"{base}/{name}", environ=(name == "environ"), cmdline=(name == "cmdline"),
                   limit=MAPS_LIMIT if name == "maps" else READ_LIMIT)
        fd_dir = proc_root / base / "fd"
        try:
            fds = sorted(os.listdir(fd_dir), key=lambda n: int(n) if n.isdigit() else 0)
        except PermissionError as exc:
            t.entries.append(Entry("proc", str(fd_dir), "file", status=DENIED, error=exc.strerror))
            continue
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            # Only GPU device files: other paths say nothing about the GPU and may say too much.
            if any(fnmatch.fnmatchcase(target, g) for g in globs):
                t.link(f"{base}/fd/{fd}", target)
                t.file(f"{base}/fdinfo/{fd}")
    return t.entries
