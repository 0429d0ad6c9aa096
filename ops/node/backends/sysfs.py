"""AMD GPUs read straight from amdgpu sysfs and KFD files, no library needed.

GPUs: KFD topology nodes (HIP's order) joined to /sys/class/drm/cardN by render minor or PCI
address; VRAM per process: /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>. Roots are parameters.
Every read runs under the settings' deadline (gpuwarden.ops.foundation.deadline): one lane per GPU, one for the KFD
per-process files, one for discovery; a GPU whose read is late comes back STALE with what was read before it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuwarden.ops.foundation.deadline import DEFAULT_S, LANES, LateRead, Lanes
from gpuwarden.ops.foundation.errors import BackendUnavailable
from gpuwarden.ops.foundation.heldfiles import HeldFiles
from gpuwarden.ops.foundation.model import GpuInfo, ProcessUsage, stale_read
from gpuwarden.ops.foundation.records import record
from gpuwarden.ops.node.backends.sensors import SysfsSensors

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): `status` reads the GPUs through here
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.ops.foundation.deadline import Mark

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
    out: list[tuple[DrmCard | None, int | None, KfdNode | None]] = []
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


def _stamp(dirs: list[str]) -> tuple[tuple[int, int] | None, ...]:
    """(inode, change time) of each directory, None where it is gone: a recreated directory differs even
    when the file system hands out the freed inode number again."""
    out: list[tuple[int, int] | None] = []
    for d in dirs:
        try:
            st = os.stat(d)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_ctime_ns))
    return tuple(out)


class _Pass:
    """One reading pass of a job: what it read so far, the files it must leave alone, whether its caller gave up."""

    __slots__ = ("values", "skip", "cancelled")

    def __init__(self, skip: set[str] | None = None):
        self.values: dict[int, dict[str, Any]] = {}
        self.skip = skip or set()
        self.cancelled = False


class SysfsBackend:
    """The sysfs/KFD backend. `sysfs_root`/`proc_root` point at /sys and /proc or a captured tree."""

    name = "sysfs"
    simulated = False

    def __init__(self, settings: Any = None, *, sysfs_root: Path | None = None, dev_root: Path | None = None,
                 name: str | None = None, simulated: bool = False, deadline_s: float | None = None,
                 lanes: Lanes | None = None):
        self.sysfs_root = Path(sysfs_root or (settings.sysfs_root if settings else "/sys"))
        self.dev_root = Path(dev_root or (settings.dev_root if settings else "/dev"))
        if name:
            self.name = name
        self.simulated = simulated
        self.deadline_s = deadline_s or (settings.read_timeout_s if settings is not None else DEFAULT_S)
        self._lanes = lanes or LANES
        self.late: tuple[LateRead, ...] = ()  # reads of the last refresh that are late and belong to no one GPU
        self._proc_dir = self.sysfs_root / "class/kfd/kfd/proc"
        self._proc_dir_s = str(self._proc_dir)
        self._held = HeldFiles(blocking_open=True)  # the KFD per-process files, read in the KFD lane only
        self._gpu_held: list[HeldFiles] = []
        self._discover()

    def _discover(self) -> None:
        """Find the GPUs and forget everything held for the ones found before (the driver was reloaded)."""
        root_s = str(self.sysfs_root)

        def discover(mark: Mark) -> tuple[list[KfdNode], list[DrmCard]]:
            mark("the KFD topology", f"{root_s}/class/kfd/kfd/topology/nodes")
            nodes = kfd_gpu_nodes(self.sysfs_root)
            mark("the DRM cards", f"{root_s}/class/drm")
            return nodes, amd_cards(self.sysfs_root)
        try:
            self._nodes, self._cards = self._lanes.run(("sysfs-discover", root_s), discover, self.deadline_s,
                                                       source="sysfs")
        except LateRead as late:
            raise BackendUnavailable(f"sysfs: {late.message}",
                                     "look for amdgpu errors in `dmesg`; --read-timeout gives slow reads longer") from None
        if not self._nodes and not self._cards:
            kfd = self.sysfs_root / "class/kfd"
            why = "no amdgpu card and no KFD GPU node" if kfd.exists() else f"no {kfd}"
            raise BackendUnavailable(f"sysfs: {why}")
        self._layout = self._join()
        self._gpu_id_to_index = {gid: i for i, (_, gid, _) in enumerate(self._layout) if gid}
        self._held.close()
        for held in self._gpu_held:
            held.close()
        # Per GPU: its held attribute files (touched by that GPU's lane only, so a read still blocked there shares
        # nothing with the others) and what _describe_one found.
        self._gpu_held = [HeldFiles(blocking_open=True) for _ in self._layout]
        self._described: dict[int, tuple[dict[str, Any], dict[str, str | None]]] = {}
        self._sensors: dict[int, SysfsSensors] = {}  # per GPU, on its held files (read in that GPU's lane)
        self._raws: dict[int, dict[str, bytes | None]] = {}
        self._gpu_lanes: set[tuple[str, str, int, int]] = set()  # per-GPU lanes in use since a read was late (see gpus)
        self._last_usage: list[ProcessUsage] = []
        self._stamp_dirs = self._identity_dirs()
        self._stamp = _stamp(self._stamp_dirs)
        self._entries: dict[str, list[list[Any]]] = {}  # pid -> its vram files (see _list_pid)
        self._refreshes = 0
        # The last full pass, when every vram file it read is held open: (listing, fds, bytes read, result).
        # The same listing and the same bytes from the same fds can only give the same result again.
        self._repeat: tuple[list[str], list[int], list[bytes], list[ProcessUsage]] | None = None
        # The cheap signal for skipping vram files (see _kfd_usage): each GPU's mem_info_vram_used as gpus() last
        # read it (None until a gpus() call precedes process_usage()); per GPU of the last full pass its held fds
        # and the bytes they read; the device figures the held files were last checked against.
        self._vram_seen: list[int | None] | None = None
        self._parts: dict[int, tuple[list[int], list[bytes]]] = {}
        self._figures: list[int | None] | None = None
        # Wall time at which each rotation phase's files were last read; the oldest is how old a figure can be.
        self._phase_read_at: list[float] = [0.0] * self.VRAM_SPREAD
        self.vram_checked_at: float | None = None  # the oldest per-process VRAM read behind the last answer
        self._relist_due = False
        # The KFD proc directory's (nlink, mtime, inode) when it was last listed (see _kfd_usage).
        self._listed_stamp: tuple[int, int, int] | None = None

    def _identity_dirs(self) -> list[str]:
        """Directories that a driver reload (or a rebuilt sim tree) replaces: each card's kobject, its
        device and hwmon directories, each KFD topology node. Their identity changing means the files
        held open are the old driver's (a removed sysfs attribute, or a deleted file still reading 0)."""
        dirs = []
        for card, _, node in self._layout:
            if card is not None:
                dirs += [str(self.sysfs_root / "class/drm" / card.card), str(card.device_dir)]
                hw = _hwmon(card.device_dir)
                if hw is not None:
                    dirs.append(str(hw))
            if node is not None:
                dirs.append(str(self.sysfs_root / "class/kfd/kfd/topology/nodes" / str(node.node)))
        return dirs

    def _follow_replaced_tree(self) -> None:
        """Once per refresh: a few stats (of kernfs directories: they answer on a hung GPU too); when the GPUs'
        directories were replaced, find the GPUs again."""
        if _stamp(self._stamp_dirs) != self._stamp:
            self._discover()

    def _join(self) -> list[tuple[DrmCard | None, int | None, KfdNode | None]]:
        return pair(self._nodes, self._cards)

    def _describe_one(self, index: int, mark: Mark) -> tuple[dict[str, Any], dict[str, str | None]]:
        """What does not change while the driver is loaded (names, ids, totals), and the paths of
        what does, resolved once: a refresh then only preads the held dynamic files."""
        card, gpu_id, node = self._layout[index]
        dev = card.device_dir if card else None
        name = None
        if dev is not None:
            mark("product_name", str(dev / "product_name"))
            name = (read_text(dev / "product_name") or "").strip() or None
        if not name and node is not None:
            gfx = node.props.get("gfx_target_version")
            name = f"AMD GPU {node.name or ''}".strip() if not gfx else \
                f"AMD GPU gfx{gfx // 10000}{(gfx // 100) % 100:x}{gfx % 100:x}"
        static = self._identity(index)
        static["name"] = name or "AMD GPU"
        if dev is not None:
            mark("unique_id", str(dev / "unique_id"))
            static["uuid"] = (read_text(dev / "unique_id") or "").strip() or None
            mark("mem_info_vram_total", str(dev / "mem_info_vram_total"))
            static["vram_total"] = read_int(dev / "mem_info_vram_total")
            mark("mem_info_gtt_total", str(dev / "mem_info_gtt_total"))
            static["gtt_total"] = read_int(dev / "mem_info_gtt_total")
            mark("current_compute_partition", str(dev / "current_compute_partition"))
            static["compute_partition"] = _word(dev / "current_compute_partition")
            static["memory_partition"] = _word(dev / "current_memory_partition")
        # Memory counters first: amdgpu keeps them itself, so they answer even when the SMU behind busy,
        # temperature and power does not, and a late GPU still shows its VRAM.
        paths: dict[str, str | None] = dict.fromkeys(("vram_used", "gtt_used", "busy_percent", "temperature_c",
                                                      "power_w"))
        if dev is not None:
            paths.update(vram_used=str(dev / "mem_info_vram_used"), gtt_used=str(dev / "mem_info_gtt_used"),
                         busy_percent=str(dev / "gpu_busy_percent"))
            hw = _hwmon(dev)
            if hw is not None:
                paths["temperature_c"] = str(hw / "temp1_input")
                # Newer kernels have power1_input where older ones only averaged.
                paths["power_w"] = str(hw / "power1_average") if (hw / "power1_average").exists() \
                    else str(hw / "power1_input")
        return static, paths

    def _identity(self, index: int) -> dict[str, Any]:
        """The GpuInfo fields known without reading a file of the GPU (enough to name a GPU that does not answer)."""
        card, gpu_id, node = self._layout[index]
        minor = card.render_minor if card else (node.props.get("drm_render_minor") if node else None)
        hive = node.props.get("hive_id") if node else None
        return dict(
            index=index, name="AMD GPU", vendor="sim" if self.simulated else "amd",
            bus_id=(card.bus_id if card else None) or (node.bus_id if node else None),
            uuid=None, vram_total=None, gtt_total=None, kfd_gpu_id=gpu_id, hive_id=f"{hive:#x}" if hive else None,
            device_files=(str(self.dev_root / "dri" / f"renderD{minor}"),) if minor is not None else (),
        )

    _SCALE = {"temperature_c": 1000.0, "power_w": 1e6}  # millidegrees, microwatts

    def _read_gpu(self, index: int, work: _Pass, mark: Mark) -> dict[str, Any] | None:
        """One GPU's fields into work.values[index] as each file answers (what a late GPU still shows); files in
        work.skip are blocked in another lane and read as None. Stops once the caller gave up on this pass."""
        described = self._described.get(index)
        if described is None:
            described = self._described[index] = self._describe_one(index, lambda w, p=None: mark(w, p, index))
        static, paths = described
        held = self._gpu_held[index]
        raws = self._raws.setdefault(index, {})  # this pass's bytes of the files below (the sensors reuse them)
        raws.clear()
        values = work.values.setdefault(index, {})
        skip = work.skip
        for key, path in paths.items():
            if work.cancelled:
                return None  # a read of this pass came back after its deadline: the files are another lane's now
            if path is None or path in skip:
                values[key] = None
                continue
            mark(path.rpartition("/")[2], path, index)
            raw = raws[path] = held.read(path, 64)
            value = None
            if raw:
                try:
                    value = int(raw.split()[0], 0)
                except (ValueError, IndexError):
                    pass
            scale = self._SCALE.get(key)
            values[key] = value / scale if value is not None and scale else value
        card = self._layout[index][0]
        sensors_key = f"{card.device_dir}/<sensors>" if card is not None else None
        if sensors_key is not None and not work.cancelled and sensors_key not in skip:
            reader = self._sensors.get(index)
            if reader is None:
                # The files the loop above reads (busy, temp1, power) are not read twice: the sensors get the bytes
                # it read, so a file that hangs is blocked in one lane only.
                mine = {path for path in paths.values() if path is not None}
                read = held.read

                def read_once(path: str, n: int, mine: set[str] = mine, read: Any = read,
                              raws: dict[str, bytes | None] = raws) -> bytes | None:
                    return raws.get(path) if path in mine else read(path, n)
                assert card is not None  # sensors_key is None without a card
                reader = self._sensors[index] = SysfsSensors(card.device_dir, read_once, self.sysfs_root)
            mark("the sensor files (clocks, fan, link, RAS)", sensors_key, index)
            sensors = reader.read()
            values["sensors"] = sensors
            if values.get("temperature_c") is None and sensors is not None:
                hot = sensors.temperatures.get("junction")  # MI300-class boards have no edge sensor (temp1)
                values["temperature_c"] = hot
        return static

    def _read_all(self, work: _Pass, mark: Mark) -> list[dict[str, Any] | None]:
        return [self._read_gpu(i, work, mark) for i in range(len(self._layout))]

    def gpus(self) -> list[GpuInfo]:
        """Every GPU. While every read answers, one job reads them all (one thread handoff a refresh). When one is
        late, each GPU gets lanes of its own, all waited for at once under one deadline, and while a lane is
        blocked in a file the next lane of that GPU reads the others (so a GPU whose busy file hangs still shows
        its VRAM): at most one lane per file, each holding at most one thread, until every lane is free again."""
        self._follow_replaced_tree()
        root_s = str(self.sysfs_root)
        n = len(self._layout)
        statics: list[dict[str, Any] | None] = [None] * n
        blocked: list[list[LateRead]] = [[] for _ in range(n)]
        values: dict[int, dict[str, Any]] = {}
        together = ("sysfs-all", root_s)
        shared_late = self._lanes.poll(together)
        todo = list(range(n))
        if shared_late is None and not any(self._lanes.poll(k) for k in self._gpu_lanes):
            self._gpu_lanes.clear()
            work = _Pass()
            values = work.values
            try:
                statics = self._lanes.run(together, lambda mark: self._read_all(work, mark), self.deadline_s,
                                          source="sysfs")
                todo = []
            except LateRead as late:
                work.cancelled = True
                statics = [None] * n
                stuck = late.gpu if late.gpu is not None else 0
                blocked[stuck].append(late)
                for i in range(stuck):
                    statics[i] = self._described[i][0]  # read whole before the late file
                todo = list(range(stuck, n))
        elif shared_late is not None and shared_late.gpu is not None:
            blocked[shared_late.gpu].append(shared_late)
        if todo:
            self._each_in_lanes(todo, root_s, statics, blocked, values)
        out = []
        for index in range(n):
            static = statics[index]
            if static is None:
                described = self._described.get(index)
                static = described[0] if described is not None else self._identity(index)
            lates = blocked[index]
            stale = stale_read(min(lates, key=lambda b: b.since)) if lates else None
            out.append(GpuInfo(**static, **dict(values.get(index, {})), stale=stale))
        self._vram_seen = [g.vram_used if g.stale is None else None for g in out]
        return out

    def _each_in_lanes(self, todo: list[int], root_s: str, statics: list[dict[str, Any] | None],
                       blocked: list[list[LateRead]], values: dict[int, dict[str, Any]]) -> None:
        """The GPUs in `todo`, each in the first of its lanes that is free, at once under one deadline."""
        jobs, passes = [], []
        for index in todo:
            described = self._described.get(index)
            for k in range(1 + (len(described[1]) if described is not None else 5)):
                key = ("sysfs-gpu", root_s, index, k)
                late = self._lanes.poll(key)
                if late is not None:
                    blocked[index].append(late)
                    continue
                work = _Pass({b.path for b in blocked[index] if b.path is not None})
                jobs.append((key, lambda mark, i=index, w=work: self._read_gpu(i, w, mark), "sysfs", index))
                passes.append((index, work))
                self._gpu_lanes.add(key)
                break
        for (index, work), answer in zip(passes, self._lanes.run_all(jobs, self.deadline_s)):
            values[index] = work.values.get(index, {})
            if isinstance(answer, LateRead):
                work.cancelled = True
                blocked[index].append(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                statics[index] = answer

    def process_usage(self) -> list[ProcessUsage]:
        """KFD's per-process VRAM, under the deadline: when a file is late, the last complete answer (and
        `late` names the file)."""
        usage, self.late = self._lanes.latest(("kfd-proc", self._proc_dir_s), self._kfd_usage, self.deadline_s,
                                              self._last_usage, source="kfd")
        self._last_usage = usage
        return usage

    def _kfd_usage(self, mark: Mark) -> list[ProcessUsage]:
        """KFD's per-process VRAM. The vram_<gpu_id> files are kept open and re-read with pread;
        each PID's directory is listed when first seen and again when the device signal asks (see _skim) or every
        RELIST_BACKSTOP refreshes (RELIST_EVERY without the signal). Only files that can have changed are read:
        see VRAM_SPREAD.
        A file that reads the same bytes as last time gives back the same ProcessUsage object, and a
        refresh where every file does gives back the very same list (callers must not change it)."""
        out: list[ProcessUsage] = []
        base = self._proc_dir_s
        mark("the KFD process list", base)
        self._refreshes += 1
        seen, self._vram_seen = self._vram_seen, None  # a signal is good for the one pass after its gpus()
        # With the device signal, directories are listed again when a GPU's VRAM moved and no file we hold changed
        # (a known process's first VRAM on another GPU: a new vram file), else every RELIST_BACKSTOP refreshes;
        # without it, every RELIST_EVERY.
        relist_all = self._relist_due or self._refreshes % (
            self.RELIST_EVERY if seen is None else self.RELIST_BACKSTOP) == 0
        self._relist_due = False
        repeat = self._repeat
        try:
            # The directory's link count is its subdirectories + 2 on sysfs (fs/kernfs/inode.c,
            # kernfs_refresh_inode: set_nlink(inode, kn->dir.subdirs + 2)), so a KFD process that comes or goes
            # changes it; its mtime moves too on tmpfs (the sim) and where kernfs keeps the directory's iattrs.
            # While the stamp holds, the last listing stands (2,000 names: 0.7 ms) and the files alone are checked,
            # with a listing every LIST_SPREAD refreshes for what the count cannot show (one process left and
            # another came in the same interval: the one that left is seen at once where its files are read, see
            # _skim; the newcomer, until it allocates, within LIST_SPREAD refreshes).
            st = os.stat(base)
            stamp = (st.st_nlink, st.st_mtime_ns, st.st_ino)
            if repeat is not None and not relist_all and stamp == self._listed_stamp and \
                    self._refreshes % self.LIST_SPREAD:
                listing = repeat[0]
            else:
                # Names only (inodes would cost a DirEntry per PID, 2,000 a refresh): a PID whose directory was
                # replaced (a new process) shows in its held files, which read an error (sysfs: the kobject is gone)
                # or nothing (the sim empties a file before it removes it); that PID is listed again at once.
                listing = [n for n in os.listdir(base) if n.isdigit()]
                self._listed_stamp = stamp
        except OSError:
            return out
        mark("the per-process VRAM files", base)
        now = time.time()
        if repeat is not None and not relist_all and listing == repeat[0]:
            same = self._skim(seen) if seen is not None else self._reread(repeat[1], repeat[2])
            if not same and listing is repeat[0]:
                # Something changed behind a listing taken earlier: look at the directory as it is now.
                try:
                    listing = [n for n in os.listdir(base) if n.isdigit()]
                except OSError:
                    return out
                self._listed_stamp = stamp
            if same:
                if seen is None:
                    self._phase_read_at = [now] * self.VRAM_SPREAD
                else:
                    self._phase_read_at[self._refreshes % self.VRAM_SPREAD] = now
                self.vram_checked_at = min(self._phase_read_at)
                return repeat[3]
        self._repeat = None
        before, self._parts = self._parts, {}
        fds: list[int] | None = []
        raws_read: list[bytes] = []
        gpus_read: list[int] = []
        held_fd = self._held.fd
        known = self._entries
        for gone in known.keys() - set(listing):
            self._forget_pid(gone)
        read = self._held.read
        append = out.append
        for pid_s in listing:
            rec = known.get(pid_s)
            entries = self._list_pid(base, pid_s, rec if relist_all else None) if rec is None or relist_all else rec
            retry = rec is not None  # a directory listed just now is the one there: no second look
            got: list[tuple[list[Any], bytes]] = []
            stale = False
            while entries is not None:
                got, stale = [], False
                for entry in entries:
                    mark(f"{pid_s}/{entry[0].rpartition('/')[2]}", entry[0])
                    raw = read(entry[0], 64)
                    if not raw:  # an attribute never reads empty: the file is gone (or the sim's, emptied)
                        stale = True
                        continue
                    got.append((entry, raw))
                if not (stale and retry):
                    break
                retry = False
                self._forget_pid(pid_s)  # a new directory under this PID, or none: list it again
                fds = None
                entries = self._list_pid(base, pid_s, None)
            if entries is None:
                continue  # the process left between the two listings
            for entry, raw in got:
                if fds is not None:
                    fd = held_fd(entry[0])
                    if fd is None:
                        fds = None  # read without a held fd (past the descriptor budget): no repeat check
                    else:
                        fds.append(fd)
                        raws_read.append(raw)
                        gpus_read.append(entry[1])
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
            parts: dict[int, tuple[list[int], list[bytes]]] = {}
            for fd, raw, gpu in zip(fds, raws_read, gpus_read):
                part = parts.get(gpu)
                if part is None:
                    part = parts[gpu] = ([], [])
                part[0].append(fd)
                part[1].append(raw)
            self._parts = parts
        figures, self._figures = self._figures, seen
        if seen is not None and figures is not None and not relist_all:
            for gpu, figure in enumerate(seen):
                if figure is not None and (gpu >= len(figures) or figures[gpu] != figure) and \
                        sorted(before.get(gpu, ((), ()))[1]) == sorted(parts.get(gpu, ((), ()))[1] if fds is not None else ()):
                    self._relist_due = True  # this GPU's VRAM moved and none of its files did: a new file?
        self._phase_read_at = [now] * self.VRAM_SPREAD
        self.vram_checked_at = now
        return out

    RELIST_EVERY = 10
    LIST_SPREAD = 8  # the KFD proc directory is listed at least this often while its stamp holds (see _kfd_usage)
    # With the device signal: a new vram file no device figure betrayed (a known process's first VRAM on a GPU while
    # another of its processes freed as much within the same refresh) is seen this many refreshes late at most. A
    # relist reads every PID's directory (2,000: 38 ms on the big sim node): at 60 that was 0.6 ms/s, an eighth of
    # the agent's CPU there, for a case that needs two exactly offsetting changes in one second.
    RELIST_BACKSTOP = 300
    # A refresh re-reads only the vram files of GPUs whose device VRAM moved since their files were last read, and
    # 1/VRAM_SPREAD of the others in turn (a deep pass spread over VRAM_SPREAD refreshes). Why this is sound: KFD's
    # vram_<gpu_id> is the process's VRAM BO total (kfd_procfs_show, pdd->vram_usage), which changes only when
    # it allocates or frees VRAM, and that moves the GPU's mem_info_vram_used, read every refresh anyway. What it
    # costs: an allocation that leaves the device total where it was (another process freed as much between two
    # refreshes) is seen by the rotation, VRAM_SPREAD refreshes later at the latest (8 s at the agent's 1 s);
    # NodeSnapshot.process_vram_checked_at says how old the oldest figure can be. inotify does not report sysfs
    # attribute changes, and the fdinfo counters cost more to read than the vram file itself.
    VRAM_SPREAD = 8

    @staticmethod
    def _reread(fds: list[int], raws: list[bytes]) -> bool:
        """Every held file reads the bytes it read last time (one C-level loop)."""
        pread = os.pread
        try:
            return [pread(fd, 64, 0) for fd in fds] == raws
        except OSError:
            return False  # a process left: the full pass drops its files

    def _skim(self, seen: list[int | None]) -> bool:
        """The files that can have changed read the same as last time: every file of a GPU whose device VRAM
        moved, this refresh's phase of the rest (see VRAM_SPREAD). False: the full pass must run."""
        phase, spread = self._refreshes % self.VRAM_SPREAD, self.VRAM_SPREAD
        figures = self._figures or []
        pread = os.pread
        parts = self._parts
        relist = False
        try:
            for gpu, figure in enumerate(seen):
                moved = figure is None or gpu >= len(figures) or figures[gpu] != figure
                part = parts.get(gpu)
                if part is None:
                    relist = relist or (moved and figure is not None)  # VRAM on a GPU no file of ours is for
                    continue
                fds, raws = part
                if moved:
                    if [pread(fd, 64, 0) for fd in fds] != raws:
                        return False
                    # None of its files moved: a vram file we do not hold yet (a known process's first VRAM on
                    # this GPU) or memory KFD does not count; the next refresh lists the directories again.
                    relist = relist or figure is not None
                elif [pread(fd, 64, 0) for fd in fds[phase::spread]] != raws[phase::spread]:
                    return False
        except OSError:
            return False
        self._figures = seen
        self._relist_due = relist
        return True

    def _forget_pid(self, pid_s: str) -> None:
        for entry in self._entries.pop(pid_s, None) or ():
            self._held.drop(entry[0])

    def _list_pid(self, base: str, pid_s: str, previous: list[list[Any]] | None) -> list[list[Any]] | None:
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
                    known: list[Any] | None = kept.pop(path, None)
                    entries.append(known or [path, index, None, None])
        for path in kept:  # files that went away
            self._held.drop(path)
        self._entries[pid_s] = entries
        return entries

    def device_globs(self) -> list[str]:
        return [str(self.dev_root / "kfd"), str(self.dev_root / "dri" / "renderD*")]

    def close(self) -> None:
        self._repeat = None
        self._held.close()
        for held in self._gpu_held:
            held.close()
