"""The simulated driver: GPUs, VRAM allocations held by real PIDs, faults, resets.

State under <state dir>/sim/: node.json, allocs/, dev/ (device files tenants hold), root/sys (the tree).
An allocation lives as long as its (pid, start ticks) exists; zombies keep theirs, like a stuck context.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from pathlib import Path

from gpuwarden.ops.foundation import statedir, statefiles
from gpuwarden.ops.node.sim import inplace, platform, registrations
from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.node.procs import identity
from gpuwarden.ops.foundation.statedir import StateFileError
from gpuwarden.ops.node.debugfs.allowlist import TRIGGERS
from gpuwarden.ops.foundation.units import fmt_bytes

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Iterator

    from gpuwarden.ops.foundation.settings import Settings

    # node.json and one allocation record, as statefiles.SIM_NODE and SIM_ALLOC checked them.
    Config = dict[str, Any]
    Alloc = dict[str, Any]

    from gpuwarden.ops.node.sim.drm import SimDrm

GPU_ID_BASE = 41000  # KFD gpu_ids are opaque numbers; distinct from indexes on purpose
RENDER_MINOR_BASE = 128
# `sim init` bounds: 64 GPUs (the state file's limit); VRAM per GPU from 64 MiB to 16 TiB (MI355X has 288 GiB),
# so 64 of them still sum far below the 2^63 bytes the state file and sysfs counters hold.
MIN_GPUS, MAX_GPUS = 1, 64
MIN_VRAM, MAX_VRAM = 64 << 20, 16 << 40
FAULTS = ("leak-on-kill", "reset-fails", "hang", "vram-fragmented")
# debugfs files that ACT when read on a real node (reset, evict, ring tests, scheduler hang): the sim has them
# as inert files so the tests can prove gpuwarden never opens them (ops/node/debugfs/allowlist.py).
TRIGGER_TEXT = "on a real node, reading this file acts on the GPU: gpuwarden must never open it\n"


def _fmt(n: int) -> str:
    return fmt_bytes(n)


def active_sim_root(settings: Settings) -> Path | None:
    """The simulated node's sysfs tree when it stands in for this node's GPUs: only when --backend sim names it,
    the one rule of ops/node/backends/select.py (no command falls back to it by itself)."""
    sim = SimNode(settings.state_dir)
    if sim.exists and settings.backend == "sim":
        return sim.sysfs_root
    return None


class SimNode:
    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.dir = Path(state_dir) / statedir.SIM
        self.root = self.dir / "root"
        self.sysfs_root = self.root / "sys"
        self.dev_root = self.dir / "dev"
        self.allocs_dir = self.dir / "allocs"
        self._node_file = self.dir / "node.json"

    # --- setup -------------------------------------------------------------------------------
    @property
    def exists(self) -> bool:
        return self._node_file.exists()

    def init(self, gpus: int = 4, vram: int = 24 << 30, *, hive: bool = False, idle_used: int = 0,
             force: bool = False, partition: str = "SPX") -> None:
        # Everything is checked before the state dir is touched: a refused init leaves the old node as it was.
        if not MIN_GPUS <= gpus <= MAX_GPUS:
            raise GpuwardenError(f"a simulated node has {MIN_GPUS} to {MAX_GPUS} GPUs, not {gpus}",
                                 f"e.g. --gpus 8; nothing in {self.dir} was changed")
        if not MIN_VRAM <= vram <= MAX_VRAM:
            raise GpuwardenError(f"simulated VRAM per GPU must be between {_fmt(MIN_VRAM)} and {_fmt(MAX_VRAM)}, "
                                 f"not {_fmt(vram)}", f"e.g. --vram 192GiB; nothing in {self.dir} was changed")
        per = platform.PARTITIONS.get(partition)
        if per is None or gpus % per:
            raise GpuwardenError(f"cannot cut {gpus} simulated GPU(s) into {partition} partitions",
                                 f"give --partition {'/'.join(platform.PARTITIONS)} with --gpus a multiple of its "
                                 "partitions per device (SPX 1, DPX 2, QPX 4, CPX 8)")
        cfg = {"gpus": gpus, "vram": vram, "gtt": vram // 2, "idle_used": idle_used,
               "hive": hive, "faults": [], "leaked": {}, "resets": {}, "created": time.time(),
               **({"partition": partition} if partition != "SPX" else {})}
        wrong = statefiles.problem(cfg, statefiles.SIM_NODE)
        if wrong is not None:  # what no command could read back
            raise GpuwardenError(f"a simulated node with {wrong} cannot be made",
                                 f"nothing in {self.dir} was changed")
        statedir.ensure(self.dir.parent, statedir.SIM)
        with self._lock():
            if self.exists and not force and self._allocs():
                raise GpuwardenError(
                    f"the simulated node in {self.dir} has live allocations",
                    "stop its tenants first, or pass --force to start over",
                )
            # deferred: keeps `gpuwarden status --json` cheap (1.9 ms there)
            import shutil  # here, not at the top: it loads bz2 and lzma, which `status` never needs
            for sub in ("root", "allocs", "dev"):
                shutil.rmtree(self.dir / sub, ignore_errors=True)  # fd-based: never follows a planted link
            statedir.unlink(self.dir / "drm-clients.json", root=self.state_dir)
            self._dir("allocs", create=True).close()
            with self._dir("dev", create=True) as dev:
                os.close(dev.open("kfd", os.O_WRONLY | os.O_CREAT, 0o644))
                with dev.subdir("dri", create=True) as dri:
                    for i in range(gpus):
                        os.close(dri.open(f"renderD{RENDER_MINOR_BASE + i}", os.O_WRONLY | os.O_CREAT, 0o644))
            self._save(cfg)
            self._write_static_tree()
            self._write_dynamic_tree()

    def config(self) -> Config:
        try:
            cfg: Config | None = statefiles.load(self._node_file, statefiles.SIM_NODE, root=self.state_dir)
        except StateFileError as exc:
            raise GpuwardenError(f"the simulated node's {self._node_file} is corrupt: {exc.problem}",
                                 "start over with `gpuwarden sim init --force`") from None
        if cfg is None:
            raise GpuwardenError(
                f"no simulated node in {self.dir}", "create one with `gpuwarden sim init`") from None
        return cfg

    def _save(self, cfg: Config) -> None:
        statedir.write_json(self._node_file, cfg, root=self.state_dir)

    def _dir(self, *parts: str, create: bool = False) -> statedir.Dir:
        """A directory of the sim node, opened through the state dir's checked fds."""
        return statedir.open_dir(self.state_dir, statedir.SIM, *parts, create=create)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with self._dir(create=True) as d:
            fd = d.open(".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # --- tenants -----------------------------------------------------------------------------
    def gpu_id(self, gpu: int) -> int:
        return GPU_ID_BASE + gpu

    def render_node(self, gpu: int) -> Path:
        return self.dev_root / "dri" / f"renderD{RENDER_MINOR_BASE + gpu}"

    def _check_gpu(self, gpu: int, cfg: Config) -> None:
        if not 0 <= gpu < cfg["gpus"]:
            raise NotFound(f"no GPU {gpu} on the simulated node (it has GPUs 0-{cfg['gpus'] - 1})")

    def bus_ids(self, cfg: dict[str, Any] | None = None) -> dict[int, str]:
        """GPU index -> its PCI address, as the static tree spells it (a device's partitions share one)."""
        cfg = cfg if cfg is not None else self.config()
        per = platform.PARTITIONS.get(cfg.get("partition", "SPX"), 1)
        return {g: f"0000:{0x10 + g // per:02x}:00.0" for g in range(cfg["gpus"])}

    @property
    def drm(self) -> "SimDrm":
        """The simulated DRM clients (fdinfo with engine time) of this node."""
        # deferred: keeps `gpuwarden --help` cheap (2.7 ms there)
        from gpuwarden.ops.node.sim.drm import SimDrm
        return SimDrm(self.state_dir, self.root / "proc")

    def open_client(self, pid: int, fd: int, gpu: int, busy: float = 0.0) -> int:
        """A DRM client for the render node `pid` holds open at `fd`, its gfx engine busy `busy` (0-1) of the time;
        returns the client id its fdinfo shows."""
        if not 0.0 <= busy <= 1.0:
            raise GpuwardenError(f"busy is a share of the time, 0 to 1, not {busy}")
        with self._lock():
            cfg = self.config()
            self._check_gpu(gpu, cfg)
            vram = sum(a["bytes"] for a in self._allocs() if a["pid"] == pid and a["gpu"] == gpu)
            drm = self.drm
            client: int = drm.open(pid, fd, gpu, busy, vram)
            drm.tick(self.bus_ids(cfg))
            return client

    def share_client(self, client: int, pid: int, fd: int) -> None:
        """`pid` shows `client` through its `fd` too (a fork kept the descriptor, or it was passed over a socket)."""
        with self._lock():
            drm = self.drm
            drm.share(client, pid, fd)
            drm.tick(self.bus_ids())

    def close_clients(self, pid: int) -> None:
        with self._lock():
            drm = self.drm
            drm.close(pid)
            drm.sweep({c["pid"] for c in drm.clients()})

    def allocate(self, pid: int, gpu: int, nbytes: int) -> None:
        """Charge `nbytes` of GPU `gpu` to process `pid` (which must exist)."""
        self.allocate_many([(pid, gpu, nbytes)])

    def allocate_many(self, items: list[tuple[int, int, int]]) -> None:
        """allocate() for each (pid, gpu, bytes), with one rewrite of the tree (benchmarks set up thousands)."""
        with self._lock():
            cfg = self.config()
            used = {g: self._used(cfg, g) for g in range(cfg["gpus"])}
            for pid, gpu, nbytes in items:
                ticks = identity(pid)
                if ticks is None:
                    raise NotFound(f"process {pid} does not exist")
                self._check_gpu(gpu, cfg)
                free = cfg["vram"] - used[gpu]
                if nbytes > free:
                    raise GpuwardenError(
                        f"out of memory on simulated GPU {gpu}: asked {_fmt(nbytes)}, {_fmt(free)} free of "
                        f"{_fmt(cfg['vram'])}",
                        "see `gpuwarden status` for who holds it")
                path = self.allocs_dir / f"{pid}-{ticks}-{gpu}.json"
                prev = (statefiles.load(path, statefiles.SIM_ALLOC, root=self.state_dir) or {}).get("bytes", 0)
                statedir.write_json(path, {"pid": pid, "ticks": ticks, "gpu": gpu, "bytes": prev + nbytes,
                                           "ts": time.time()}, root=self.state_dir)
                used[gpu] += nbytes
            self._write_dynamic_tree(cfg)

    def free(self, pid: int, gpu: int | None = None) -> None:
        with self._lock():
            for a in self._allocs():
                if a["pid"] == pid and (gpu is None or a["gpu"] == gpu):
                    statedir.unlink(self.allocs_dir / a["_file"], root=self.state_dir)
            self._write_dynamic_tree()

    def _allocs(self) -> list[Alloc]:
        out = []
        for name in statedir.listdir(self.allocs_dir, root=self.state_dir):
            if not name.endswith(".json"):
                continue
            try:
                data = dict(statefiles.load(self.allocs_dir / name, statefiles.SIM_ALLOC, root=self.state_dir))
            except (OSError, TypeError, GpuwardenError):
                continue  # not an allocation record: the driver ignores it
            data["_file"] = name
            out.append(data)
        return out

    def _used(self, cfg: Config, gpu: int, allocs: list[Alloc] | None = None) -> int:
        allocs = self._allocs() if allocs is None else allocs
        used: int = (cfg.get("idle_used", 0) + int(cfg.get("leaked", {}).get(str(gpu), 0))
                     + sum(a["bytes"] for a in allocs if a["gpu"] == gpu))
        return used

    # --- the driver's work -------------------------------------------------------------------
    def sync(self) -> None:
        """Drop allocations whose process is gone (leaking them when the fault says so); rewrite the tree."""
        with self._lock():
            cfg = self.config()
            leak = "leak-on-kill" in cfg.get("faults", [])
            changed = False
            for a in self._allocs():
                if identity(a["pid"]) == a["ticks"]:
                    continue  # alive or zombie: a context lives as long as its PID
                statedir.unlink(self.allocs_dir / a["_file"], root=self.state_dir)
                changed = True
                if leak:
                    leaked = cfg.setdefault("leaked", {})
                    leaked[str(a["gpu"])] = int(leaked.get(str(a["gpu"]), 0)) + a["bytes"]
            if changed:
                self._save(cfg)
            self._write_dynamic_tree(cfg)

    def set_fault(self, fault: str, on: bool, gpus: list[int] | None = None) -> None:
        """Switch a fault; `gpus` (hang only) limits the hang to those GPUs (default: every GPU)."""
        if fault not in FAULTS:
            raise GpuwardenError(f"unknown fault {fault!r}", f"choose one of: {', '.join(FAULTS)}")
        if gpus and fault != "hang":
            raise GpuwardenError(f"--gpu applies to the hang fault only, not {fault}")
        with self._lock():
            cfg = self.config()
            for g in gpus or ():
                self._check_gpu(g, cfg)
            faults = set(cfg.get("faults", []))
            (faults.add if on else faults.discard)(fault)
            cfg["faults"] = sorted(faults)
            if fault == "hang":
                cfg["hang_gpus"] = sorted(set(gpus)) if on and gpus else []
            self._save(cfg)
            if fault == "hang":
                self._write_dynamic_tree(cfg)

    def set_kfd_limit(self, limit: int | None) -> None:
        """The simulated KFD system-memory limit its debugfs kfd/mem_limit shows (None: this host's RAM's), as a
        scenario sets it for the canaries' GPUWARDEN_SIM_KFD_LIMIT."""
        with self._lock():
            cfg = self.config()
            if limit is None:
                cfg.pop("kfd_limit", None)
            else:
                cfg["kfd_limit"] = int(limit)
            self._save(cfg)
        self.sync()

    def hung_gpus(self, cfg: Config | None = None) -> set[int]:
        """The GPUs whose driver files block on read (the hang fault)."""
        cfg = cfg or self.config()
        if "hang" not in cfg.get("faults", []):
            return set()
        only = {g for g in cfg.get("hang_gpus", []) if isinstance(g, int)}
        return {g for g in range(cfg["gpus"]) if not only or g in only}

    def leak(self, gpu: int, nbytes: int) -> None:
        """Leave `nbytes` of ownerless residual VRAM on a GPU (a drill for purge and reset)."""
        with self._lock():
            cfg = self.config()
            self._check_gpu(gpu, cfg)
            if nbytes <= 0:
                raise GpuwardenError(f"a leak must be more than 0 bytes, not {nbytes}", "e.g. --size 14GiB")
            free = cfg["vram"] - self._used(cfg, gpu)
            if nbytes > free:
                # A driver cannot leak memory the GPU does not have: 100 GiB "used" of 24 would read 417%.
                raise GpuwardenError(
                    f"simulated GPU {gpu} has {fmt_bytes(free)} free of {fmt_bytes(cfg['vram'])}: "
                    f"it cannot leak {fmt_bytes(nbytes)}",
                    f"leak at most {fmt_bytes(free)} (or give the simulated GPUs more with sim init --vram)")
            leaked = cfg.setdefault("leaked", {})
            leaked[str(gpu)] = int(leaked.get(str(gpu), 0)) + nbytes
            self._save(cfg)
            self._write_dynamic_tree(cfg)

    def reset(self, gpu: int) -> None:
        """A GPU reset: every context on it is lost, leaked memory returns, the GPU re-enumerates."""
        with self._lock():
            cfg = self.config()
            self._check_gpu(gpu, cfg)
            if "reset-fails" in cfg.get("faults", []):
                raise GpuwardenError(f"simulated GPU {gpu}: reset failed (fault 'reset-fails' is on)",
                                     "clear it with `gpuwarden sim fault reset-fails off`")
            # A reset acts on the physical device: every partition of it loses its contexts and leaks.
            per = platform.PARTITIONS.get(cfg.get("partition", "SPX"), 1)
            device = set(range(gpu // per * per, gpu // per * per + per))
            for a in self._allocs():
                if a["gpu"] in device:
                    statedir.unlink(self.allocs_dir / a["_file"], root=self.state_dir)
            for g in device:
                cfg.setdefault("leaked", {}).pop(str(g), None)
            hung = self.hung_gpus(cfg)
            if gpu in hung:  # a reset recovers a wedged GPU, as amdgpu's does a hung SMU
                cfg["hang_gpus"] = sorted(hung - {gpu})
                if not cfg["hang_gpus"]:
                    cfg["faults"] = [f for f in cfg.get("faults", []) if f != "hang"]
            resets = cfg.setdefault("resets", {})
            resets[str(gpu)] = int(resets.get(str(gpu), 0)) + 1
            self._save(cfg)
            self._write_dynamic_tree(cfg)

    def describe(self) -> dict[str, object]:
        cfg = self.config()
        allocs = self._allocs()
        return {
            "dir": str(self.dir), "gpus": cfg["gpus"], "vram": cfg["vram"], "hive": cfg.get("hive", False),
            "faults": cfg.get("faults", []),
            "leaked": {int(k): v for k, v in cfg.get("leaked", {}).items()},
            "resets": {int(k): v for k, v in cfg.get("resets", {}).items()},
            "allocations": [{k: v for k, v in a.items() if k != "_file"} for a in allocs],
        }

    # --- the tree ----------------------------------------------------------------------------
    def _write_static_tree(self) -> None:
        cfg = self.config()
        self._dir("root/sys/class/kfd/kfd/proc", create=True).close()
        with self._dir("root/sys/class/kfd/kfd/topology/nodes/0", create=True) as cpu:
            cpu.write_atomic("gpu_id", "0\n", 0o644)
            cpu.write_atomic("name", "\n", 0o644)
            cpu.write_atomic("properties", "cpu_cores_count 16\nsimd_count 0\nmem_banks_count 1\n", 0o644)
        per = platform.PARTITIONS.get(cfg.get("partition", "SPX"), 1)
        for i in range(cfg["gpus"]):
            bus = 0x10 + i // per  # bus_ids() spells the same address; a device's partitions share it
            self._dir(f"root/sys/class/drm/card{i}/device/drm/renderD{RENDER_MINOR_BASE + i}", create=True).close()
            self._dir(f"root/sys/class/drm/card{i}/device/hwmon/hwmon0", create=True).close()
            files = {
                "vendor": "0x1002\n", "device": "0x74a1\n",
                "uevent": f"DRIVER=amdgpu\nPCI_SLOT_NAME=0000:{bus:02x}:00.0\n",
                "product_name": "gpuwarden simulated GPU\n",
                "unique_id": f"5157{i:012x}\n",
                "mem_info_vram_total": f"{cfg['vram']}\n",
                "mem_info_gtt_total": f"{cfg['gtt']}\n",
            }
            with self._dir(f"root/sys/class/drm/card{i}/device") as dev:
                for name, text in files.items():
                    dev.write_atomic(name, text, 0o644)
            hive = 0x5151_0001 if cfg.get("hive") else 0
            with self._dir(f"root/sys/class/kfd/kfd/topology/nodes/{i + 1}", create=True) as node:
                node.write_atomic("gpu_id", f"{self.gpu_id(i)}\n", 0o644)
                node.write_atomic("name", "gfx942\n", 0o644)
                node.write_atomic("properties",
                                  "cpu_cores_count 0\nsimd_count 1216\ngfx_target_version 90402\nvendor_id 4098\n"
                                  f"device_id 29857\nlocation_id {bus << 8}\ndomain 0\n"
                                  f"drm_render_minor {RENDER_MINOR_BASE + i}\nhive_id {hive}\n", 0o644)
        platform.write(self.sysfs_root, cfg["gpus"], cfg["vram"], bool(cfg.get("hive")), cfg.get("partition", "SPX"))
        for i in range(cfg["gpus"]):
            self._dir(f"root/sys/kernel/debug/dri/{i}", create=True).close()
        self._dir("root/sys/kernel/debug/kfd", create=True).close()
        for template in TRIGGERS:
            for minor in (range(cfg["gpus"]) if "{minor}" in template else [None]):
                rel = template.format(minor=minor)
                with self._dir("root/sys/kernel/debug", *rel.split("/")[:-1]) as d:
                    d.write_atomic(rel.split("/")[-1], TRIGGER_TEXT, 0o400)

    def _write_dynamic_tree(self, cfg: Config | None = None) -> None:
        """Used VRAM per GPU and the KFD per-process files, rewritten only where they changed."""
        cfg = cfg or self.config()
        allocs = self._allocs()
        hung = self.hung_gpus(cfg)
        with self._dir("root/sys/class/drm") as drm:
            for i in range(cfg["gpus"]):
                used = self._used(cfg, i, allocs)
                n = sum(1 for a in allocs if a["gpu"] == i)
                busy = min(100, 12 * n)
                with drm.subdir(f"card{i}") as card, card.subdir("device") as dev:
                    # In place, like sysfs attributes: readers keep these open and pread them.
                    _put_in_place(dev, "mem_info_vram_used", used)
                    _put_in_place(dev, "mem_info_gtt_used", min(cfg["gtt"], 64 << 20))
                    # The DPM level in use follows the load, as amdgpu's pp_dpm_* files star it.
                    level = 0 if busy == 0 else 1 if busy < 50 else 2
                    _put_text_in_place(dev, "pp_dpm_sclk", platform.dpm_table(platform.SCLK_LEVELS, level))
                    _put_text_in_place(dev, "pp_dpm_mclk", platform.dpm_table(platform.MCLK_LEVELS, level))
                    _put_in_place(dev, "mem_busy_percent", busy // 2)
                    with dev.subdir("hwmon") as hw, hw.subdir("hwmon0") as mon:
                        edge = 34 + busy // 3
                        _put_in_place(mon, "temp2_input", (edge + 9) * 1000)  # junction (hotspot)
                        _put_in_place(mon, "temp3_input", (edge + 5) * 1000)  # HBM
                        # The hang fault wedges what amdgpu answers by asking the GPU's SMU (a hung SMU never
                        # replies), not the memory counters the driver keeps itself.
                        for d, name, value in ((dev, "gpu_busy_percent", busy),
                                               (mon, "temp1_input", edge * 1000),
                                               (mon, "power1_average", (90 + 5 * busy) * 1_000_000)):
                            if i in hung:
                                _wedge(d, name)
                            else:
                                _unwedge(d, name)
                                _put_in_place(d, name, value)
        self._write_debugfs(cfg, allocs)
        per_pid: dict[int, dict[int, int]] = {}
        for a in allocs:
            gpus = per_pid.setdefault(a["pid"], {})
            gpus[a["gpu"]] = gpus.get(a["gpu"], 0) + a["bytes"]
        proc_dir = self.sysfs_root / "class/kfd/kfd/proc"
        with self._dir("root/sys/class/kfd/kfd/proc", create=True) as procs:
            for name in procs.listdir():
                if not name.isdigit() or int(name) not in per_pid:
                    # deferred: keeps `gpuwarden status --json` cheap (1.9 ms there)
                    import shutil
                    if name.isdigit():
                        _empty_files(procs, name)
                    shutil.rmtree(proc_dir / name, ignore_errors=True)
            for pid, gpus in per_pid.items():
                with procs.subdir(str(pid), create=True) as d:
                    # Like KFD, a GPU the process has released keeps its file, at 0.
                    for name in d.listdir():
                        if name.startswith("vram_") and name[5:].isdigit() and int(name[5:]) - GPU_ID_BASE not in gpus:
                            _put_in_place(d, name, 0)
                    for g, b in gpus.items():
                        _put_in_place(d, f"vram_{self.gpu_id(g)}", b)


    def _write_debugfs(self, cfg: Config, allocs: list[Alloc]) -> None:
        """kfd/mem_limit and dri/N/amdgpu_{gem_info,vm_info,vram_mm}, in the kernel's own print formats."""
        try:
            charged = registrations.charged(self.state_dir)
        except (OSError, GpuwardenError):
            charged = 0
        limit = cfg.get("kfd_limit") or _kfd_limit()
        mib = 1 << 20
        try:
            with self._dir("root/sys/kernel/debug/kfd") as kfd:
                _put_text(kfd, "mem_limit", f"System mem used {charged // mib}M out of {limit // mib}M\n"
                                            f"TTM mem used 0M out of {cfg['gtt'] * cfg['gpus'] // mib}M\n")
        except GpuwardenError:
            return  # a node made before the sim had a debugfs tree: `sim init` again to get one
        fragmented = "vram-fragmented" in cfg.get("faults", [])
        for i in range(cfg["gpus"]):
            mine = [a for a in allocs if a["gpu"] == i]
            gem, vm = [], []
            for pid in sorted({a["pid"] for a in mine}):
                comm = _comm(pid)
                bos = [a["bytes"] for a in mine if a["pid"] == pid]
                gem.append(f"pid {pid:8d} command {comm}:\n")
                gem += [f"\t\t0x{n + 1:08x}: {b:12d} byte VRAM NO_CPU_ACCESS\n" for n, b in enumerate(bos)]
                vm.append(f"pid:{pid}\tProcess:{comm} ----------\n\tIdle BOs:\n")
                vm += [f"\t\t0x{n:08x}: {b:12d} byte VRAM NO_CPU_ACCESS\n" for n, b in enumerate(bos)]
                vm.append("\tEvicted BOs:\n\tRelocated BOs:\n\tMoved BOs:\n\tInvalidated BOs:\n\tDone BOs:\n")
                vm.append(f"\tTotal idle size:        {sum(bos):12d}\tobjs:\t{len(bos)}\n")
                vm += [f"\tTotal {k} size:{' ' * (16 - len(k))}{0:12d}\tobjs:\t0\n"
                       for k in ("evicted", "relocated", "moved", "invalidated", "done")]
            free = max(0, cfg["vram"] - self._used(cfg, i, allocs))
            with self._dir(f"root/sys/kernel/debug/dri/{i}") as d:
                _put_text(d, "amdgpu_gem_info", "".join(gem))
                _put_text(d, "amdgpu_vm_info", "".join(vm))
                _put_text(d, "amdgpu_vram_mm", _buddy_print(cfg["vram"], free, fragmented))


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()[:15] or "<unknown>"
    except OSError:
        return "<unknown>"


def _kfd_limit() -> int:
    """KFD's max_system_mem_limit for this host's RAM (RAM - RAM/64 - 1.5 GiB), as the driver computes it."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    limit = total - (total >> 6)
    return limit >> 1 if limit < 2 * (3 << 29) else limit - (3 << 29)


def _buddy_print(total: int, free: int, fragmented: bool) -> str:
    """What drm_buddy_print writes for a 4 KiB-chunk manager with `free` bytes free: whole power-of-two blocks,
    or (fault vram-fragmented) the same bytes in 2 MiB crumbs."""
    chunk = 4096
    counts: dict[int, int] = {}
    pages = free // chunk
    if fragmented:
        counts[9] = pages >> 9
        counts[0] = pages & 511
    else:
        for order in range(40, -1, -1):
            if pages >> order & 1:
                counts[order] = 1
    top = max(total // chunk, 1).bit_length() - 1
    lines = [f"chunk_size: {chunk >> 10}KiB, total: {total >> 20}MiB, free: {free >> 20}MiB, clear_free: 0MiB\n"]
    for order in range(top, -1, -1):
        n = counts.get(order, 0)
        size = n * (chunk << order)
        amount = f"{size >> 10:8d} KiB" if size < (1 << 20) else f"{size >> 20:8d} MiB"
        lines.append(f"order-{order:2d} free: {amount}, blocks: {n}\n")
    return "".join(lines)


def _put_text(d: statedir.Dir, name: str, text: str) -> None:
    """Rewrite a small text file in place when it changed (no fsync, no new inode: it is a stand-in for debugfs)."""
    data = text.encode()
    fd = d.open(name, os.O_RDWR | os.O_CREAT, 0o444)
    try:
        inplace.rewrite(fd, data)
    finally:
        os.close(fd)


def _wedge(d: statedir.Dir, name: str) -> None:
    """Put a FIFO without a writer where the attribute was: a reader's open blocks in the kernel, as on a hung GPU."""
    st = d.stat(name)
    if st is not None and stat.S_ISFIFO(st.st_mode):
        return
    tmp = f".{name}.hang"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=d.fd)
    os.mkfifo(tmp, 0o644, dir_fd=d.fd)
    d.rename(tmp, name)


def _unwedge(d: statedir.Dir, name: str) -> None:
    """The driver answers again: the attribute becomes a file, and readers still blocked on the FIFO are let go."""
    st = d.stat(name)
    if st is None or not stat.S_ISFIFO(st.st_mode):
        return
    try:
        # Read-write (Linux opens a FIFO so without waiting): while it is held every reader's open succeeds at
        # once, whether it was blocked already or arrives before the unlink; closing it gives them end-of-file.
        # A write-only open fails (ENXIO) when nobody waits at that instant, and a reader arriving between that
        # and the unlink blocked for good (the likely cause of a clean-clone run whose sampling did not resume).
        writer = os.open(name, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d.fd)
    except OSError:
        writer = None
    try:
        d.unlink(name)  # _put_in_place makes the regular file again
    finally:
        if writer is not None:
            os.close(writer)


def _put_text_in_place(d: statedir.Dir, name: str, text: str) -> None:
    """Rewrite a text attribute in place (same inode, truncated to its new length), as _put_in_place does numbers."""
    _put_in_place(d, name, None, text.encode())


def _empty_files(procs: statedir.Dir, pid: str) -> None:
    """Empty a leaving process's vram files first: a reader holding one open then reads nothing, as a real KFD
    attribute of a removed process reads an error, never the old number (a new process may take the PID)."""
    with contextlib.suppress(OSError, GpuwardenError), procs.subdir(pid) as d:
        for name in d.listdir():
            with contextlib.suppress(OSError, GpuwardenError):
                os.close(d.open(name, os.O_WRONLY | os.O_TRUNC))


def _put_in_place(d: statedir.Dir, name: str, value: int | None, data: bytes | None = None) -> None:
    """Rewrite a number in place, fixed width: readers keep these files open and pread them,
    as they do real sysfs attributes, so the inode must stay the same."""
    data = f"{value:<23d}\n".encode() if data is None else data
    try:
        fd = d.open(name, os.O_RDWR | os.O_CREAT, 0o644)
    except GpuwardenError as exc:
        if "no permission" not in exc.message:
            raise
        raise GpuwardenError(
            f"cannot update the simulated node's file {d.path / name}: it belongs to another user",
            "run the sim node's tenants and gpuwarden as the same user, or use a state dir of your own") from None
    try:
        inplace.rewrite(fd, data)
    finally:
        os.close(fd)
