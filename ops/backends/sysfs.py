"""AMD GPUs read straight from amdgpu sysfs and KFD files, no library needed.

GPUs: KFD topology nodes (HIP's order) joined to /sys/class/drm/cardN by render minor or PCI
address; VRAM per process: /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>. Roots are parameters.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import BackendUnavailable
from ..heldfiles import HeldFiles
from ..model import GpuInfo, ProcessUsage
from ..records import record
from .sensors import SysfsSensors

AMD_VENDOR = 0x1002


def read_text(path: Path | str) -> str | None:
    try:
        # O_NONBLOCK: a FIFO in a captured or simulated tree must not hang the refresh.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_int(path: Path | str) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip().split()[0], 0)
    except (ValueError, IndexError):
        return None


def parse_properties(text: str) -> dict[str, int]:
    """KFD topology `properties`: "key value" per line, values integers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def bdf_from_location(domain: int, location_id: int) -> str:
    """KFD encodes bus/device/function as (bus << 8) | (device << 3) | function."""
    bus, dev, fn = (location_id >> 8) & 0xFF, (location_id >> 3) & 0x1F, location_id & 0x7
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


@record
class KfdNode:
    node: int
    gpu_id: int
    name: str
    props: dict[str, int]

    @property
    def bus_id(self) -> str | None:
        if "location_id" not in self.props:
            return None
        return bdf_from_location(self.props.get("domain", 0), self.props["location_id"])


def kfd_gpu_nodes(sysfs_root: Path) -> list[KfdNode]:
    """GPU nodes of the KFD topology in node order (CPU-only nodes have gpu_id 0 and are skipped)."""
    base = sysfs_root / "class/kfd/kfd/topology/nodes"
    try:
        numbers = sorted(int(n) for n in os.listdir(base) if n.isdigit())
    except OSError:
        return []
    nodes = []
    for n in numbers:
        gpu_id = read_int(base / str(n) / "gpu_id")
        if not gpu_id:
            continue
        props = parse_properties(read_text(base / str(n) / "properties") or "")
        nodes.append(KfdNode(n, gpu_id, (read_text(base / str(n) / "name") or "").strip(), props))
    return nodes


@record
class DrmCard:
    card: str  # "card0"
    device_dir: Path
    bus_id: str | None
    render_minor: int | None


def amd_cards(sysfs_root: Path) -> list[DrmCard]:
    base = sysfs_root / "class/drm"
    try:
        names = sorted((n for n in os.listdir(base) if n.startswith("card") and n[4:].isdigit()),
                       key=lambda n: int(n[4:]))
    except OSError:
        return []
    cards = []
    for name in names:
        dev = base / name / "device"
        if read_int(dev / "vendor") != AMD_VENDOR:
            continue
        bus = None
        uevent = read_text(dev / "uevent") or ""
        for line in uevent.splitlines():
            if line.startswith("PCI_SLOT_NAME="):
                bus = line.split("=", 1)[1].strip().lower()
        if bus is None:
            try:
                bus = os.path.basename(os.path.realpath(dev)).lower() or None
                if bus and ":" not in bus:
                    bus = None
            except OSError:
                bus = None
        minor = None
        try:
            for n in os.listdir(dev / "drm"):
                if n.startswith("renderD"):
                    minor = int(n[7:])
        except (OSError, ValueError):
            pass
        cards.append(DrmCard(name, dev, bus, minor))
    return cards


def pair(nodes: list[KfdNode], cards: list[DrmCard]) -> list[tuple[DrmCard | None, int | None, KfdNode | None]]:
    """Pair KFD nodes with DRM cards; order is KFD's (what HIP enumerates), else the cards'."""
    if not nodes:
        return [(c, None, None) for c in cards]
    by_minor = {c.render_minor: c for c in cards if c.render_minor is not None}
    by_bus = {c.bus_id: c for c in cards if c.bus_id}
    out = []
    for node in nodes:
        card = by_minor.get(node.props.get("drm_render_minor", -1)) or by_bus.get(node.bus_id or "")
        out.append((card, node.gpu_id, node))
    return out


def _word(path: Path) -> str | None:
    """A one-word attribute ("CPX", "NPS4"), None when absent or empty."""
    text = (read_text(path) or "").strip()
    return text.split()[0] if text else None


def _hwmon(dev: Path) -> Path | None:
    try:
        names = sorted(os.listdir(dev / "hwmon"))
    except OSError:
        return None
    return dev / "hwmon" / names[0] if names else None


class SysfsBackend:
    """The sysfs/KFD backend. `sysfs_root`/`proc_root` point at /sys and /proc or a captured tree."""

    name = "sysfs"
    simulated = False

    def __init__(self, settings=None, *, sysfs_root: Path | None = None, dev_root: Path | None = None,
                 name: str | None = None, simulated: bool = False):
        self.sysfs_root = Path(sysfs_root or (settings.sysfs_root if settings else "/sys"))
        self.dev_root = Path(dev_root or (settings.dev_root if settings else "/dev"))
        if name:
            self.name = name
        self.simulated = simulated
        self._nodes = kfd_gpu_nodes(self.sysfs_root)
        self._cards = amd_cards(self.sysfs_root)
        if not self._nodes and not self._cards:
            kfd = self.sysfs_root / "class/kfd"
            why = "no amdgpu card and no KFD GPU node" if kfd.exists() else f"no {kfd}"
            raise BackendUnavailable(f"sysfs: {why}")
        self._layout = self._join()
        self._proc_dir = self.sysfs_root / "class/kfd/kfd/proc"
        self._gpu_id_to_index = {gid: i for i, (_, gid, _) in enumerate(self._layout) if gid}
        self._held = HeldFiles()
        self._described: list[tuple[dict, dict[str, str | None]]] | None = None
        self._sensors: list[SysfsSensors | None] = []
        self._proc_dir_s = str(self._proc_dir)
        self._entries: dict[str, tuple[int, list[list]]] = {}  # pid -> (its directory's inode, see _list_pid)
        self._refreshes = 0
        # The last full pass, when every vram file it read is held open: (listing, fds, bytes read, result).
        # The same listing and the same bytes from the same fds can only give the same result again.
        self._repeat: tuple[dict[str, int], list[int], list[bytes], list[ProcessUsage]] | None = None

    def _join(self) -> list[tuple[DrmCard | None, int | None, KfdNode | None]]:
        return pair(self._nodes, self._cards)

    def _describe(self) -> list[tuple[dict, dict[str, str | None]]]:
        """What does not change while the driver is loaded (names, ids, totals), and the paths of
        what does, resolved once: a refresh then only preads the held dynamic files."""
        out = []
        for index, (card, gpu_id, node) in enumerate(self._layout):
            dev = card.device_dir if card else None
            name = None
            if dev is not None:
                name = (read_text(dev / "product_name") or "").strip() or None
            if not name and node is not None:
                gfx = node.props.get("gfx_target_version")
                name = f"AMD GPU {node.name or ''}".strip() if not gfx else \
                    f"AMD GPU gfx{gfx // 10000}{(gfx // 100) % 100:x}{gfx % 100:x}"
            minor = card.render_minor if card else (node.props.get("drm_render_minor") if node else None)
            hive = node.props.get("hive_id") if node else None
            static = dict(
                index=index, name=name or "AMD GPU", vendor="sim" if self.simulated else "amd",
                bus_id=(card.bus_id if card else None) or (node.bus_id if node else None),
                uuid=((read_text(dev / "unique_id") or "").strip() or None) if dev is not None else None,
                vram_total=read_int(dev / "mem_info_vram_total") if dev is not None else None,
                gtt_total=read_int(dev / "mem_info_gtt_total") if dev is not None else None,
                kfd_gpu_id=gpu_id, hive_id=f"{hive:#x}" if hive else None,
                compute_partition=_word(dev / "current_compute_partition") if dev is not None else None,
                memory_partition=_word(dev / "current_memory_partition") if dev is not None else None,
                device_files=(str(self.dev_root / "dri" / f"renderD{minor}"),) if minor is not None else (),
            )
            paths: dict[str, str | None] = dict.fromkeys(("vram_used", "gtt_used", "busy", "temp", "power"))
            if dev is not None:
                paths.update(vram_used=str(dev / "mem_info_vram_used"), gtt_used=str(dev / "mem_info_gtt_used"),
                             busy=str(dev / "gpu_busy_percent"))
                hw = _hwmon(dev)
                if hw is not None:
                    paths["temp"] = str(hw / "temp1_input")
                    # Newer kernels have power1_input where older ones only averaged.
                    paths["power"] = str(hw / "power1_average") if (hw / "power1_average").exists() \
                        else str(hw / "power1_input")
            out.append((static, paths))
            self._sensors.append(SysfsSensors(dev, self._held.read, self.sysfs_root) if dev is not None else None)
        return out

    def _held_int(self, path: str | None) -> int | None:
        if path is None:
            return None
        raw = self._held.read(path, 64)
        if not raw:
            return None
        try:
            return int(raw.split()[0], 0)
        except (ValueError, IndexError):
            return None

    def gpus(self) -> list[GpuInfo]:
        if self._described is None:
            self._described = self._describe()
        out = []
        for (static, paths), reader in zip(self._described, self._sensors):
            temp = self._held_int(paths["temp"])
            power = self._held_int(paths["power"])
            sensors = reader.read() if reader is not None else None
            if temp is None and sensors is not None:  # MI300-class boards have no edge sensor (temp1)
                hot = sensors.temperatures.get("junction")
                temp = None if hot is None else round(hot * 1000)
            out.append(GpuInfo(
                **static,
                vram_used=self._held_int(paths["vram_used"]),
                gtt_used=self._held_int(paths["gtt_used"]),
                busy_percent=self._held_int(paths["busy"]),
                temperature_c=temp / 1000.0 if temp is not None else None,
                power_w=power / 1e6 if power is not None else None,
                sensors=sensors,
            ))
        return out

    def process_usage(self) -> list[ProcessUsage]:
        """KFD's per-process VRAM. The vram_<gpu_id> files are kept open and re-read with pread;
        each PID's directory is listed when first seen and again every RELIST_EVERY refreshes.
        A file that reads the same bytes as last time gives back the same ProcessUsage object, and a
        refresh where every file does gives back the very same list (callers must not change it)."""
        out: list[ProcessUsage] = []
        base = self._proc_dir_s
        try:
            with os.scandir(base) as it:
                # The directory's inode tells a PID's new directory (a new process) from the old one,
                # whose held files (on a plain file tree like the sim's) would still read the old numbers.
                listing = {e.name: e.inode() for e in it if e.name.isdigit()}
        except OSError:
            return out
        self._refreshes += 1
        relist_all = self._refreshes % self.RELIST_EVERY == 0
        repeat = self._repeat
        if repeat is not None and not relist_all and listing == repeat[0]:
            pread = os.pread
            try:
                raws = [pread(fd, 64, 0) for fd in repeat[1]]  # one C-level loop: 2,000 PIDs in ~2 ms
            except OSError:
                raws = None  # a process left: the full pass below drops its files
            if raws == repeat[2]:
                return repeat[3]
        self._repeat = None
        fds: list[int] | None = []
        raws_read: list[bytes] = []
        held_fd = self._held.fd
        known = self._entries
        for gone in known.keys() - listing.keys():
            self._forget_pid(gone)
        read = self._held.read
        append = out.append
        for pid_s, ino in listing.items():
            rec = known.get(pid_s)
            if rec is None or rec[0] != ino:
                if rec is not None:
                    self._forget_pid(pid_s)
                entries = self._list_pid(base, pid_s, ino, None)
            elif relist_all:
                entries = self._list_pid(base, pid_s, ino, rec[1])
            else:
                entries = rec[1]
            if entries is None:
                continue  # the process left between the two listings
            stale = False
            for entry in entries:
                raw = read(entry[0], 64)
                if raw is None:
                    stale = True
                    continue
                if fds is not None:
                    fd = held_fd(entry[0])
                    if fd is None:
                        fds = None  # read without a held fd (past the descriptor budget): no repeat check
                    else:
                        fds.append(fd)
                        raws_read.append(raw)
                if raw == entry[2]:
                    append(entry[3])
                    continue
                try:
                    value = int(raw)
                except ValueError:
                    try:
                        value = int(raw.split()[0])
                    except (ValueError, IndexError):
                        continue
                usage = ProcessUsage(pid=int(pid_s), gpu_index=entry[1], vram_bytes=value, source="kfd")
                entry[2] = raw
                entry[3] = usage
                append(usage)
            if stale:
                self._forget_pid(pid_s)
                fds = None
        if fds is not None:
            self._repeat = (listing, fds, raws_read, out)
        return out

    RELIST_EVERY = 10

    def _forget_pid(self, pid_s: str) -> None:
        rec = self._entries.pop(pid_s, None)
        for entry in rec[1] if rec else ():
            self._held.drop(entry[0])

    def _list_pid(self, base: str, pid_s: str, ino: int, previous: list[list] | None) -> list[list] | None:
        """[path, gpu index, last bytes read, last ProcessUsage] per vram file of one PID directory."""
        try:
            names = os.listdir(f"{base}/{pid_s}")
        except OSError:
            self._forget_pid(pid_s)
            return None
        kept = {e[0]: e for e in previous} if previous else {}
        entries = []
        for entry in names:
            if entry.startswith("vram_"):
                try:
                    index = self._gpu_id_to_index.get(int(entry[5:]))
                except ValueError:
                    continue
                if index is not None:
                    path = f"{base}/{pid_s}/{entry}"
                    entries.append(kept.pop(path, None) or [path, index, None, None])
        for path in kept:  # files that went away
            self._held.drop(path)
        self._entries[pid_s] = (ino, entries)
        return entries

    def device_globs(self) -> list[str]:
        return [str(self.dev_root / "kfd"), str(self.dev_root / "dri" / "renderD*")]

    def close(self) -> None:
        self._repeat = None
        self._held.close()
