"""Budget preflight: the bytes KFD will charge for the arena registrations, against KFD's system-memory limit.

Pure arithmetic over /proc/meminfo and the amdgpu module parameter, both read under the settings' roots.

Sources of the facts (public code):
- Linux drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd_gpuvm.c, amdgpu_amdkfd_gpuvm_init_mem_limits():
  mem = totalram; max_system_mem_limit = mem - mem/64, then minus AMDGPU_RESERVE_MEM_LIMIT (3 << 29 = 1.5 GiB),
  or halved instead when that would leave less than 2 x 1.5 GiB. amdgpu_amdkfd_reserve_mem_limit() charges a
  KFD_IOC_ALLOC_MEM_FLAGS_USERPTR allocation's full size to system_mem_used and fails it with -ENOMEM past that
  limit unless the module parameter no_system_mem_limit is set ("Set no_system_mem_limit=1 if using shared
  memory"). The limit is global: every process and every GPU draws from the one counter.
- ROCm clr, rocclr/device/rocm/rocmemory.cpp: a host registration is pinned with
  hsa_amd_memory_lock_to_pool(host, size, nullptr, 0, ...); ROCR-Runtime's hsa_ext_amd.h documents that agents
  NULL with num_agent 0 gives every agent in the platform access, i.e. one userptr allocation per GPU the
  process can see (ROCR_VISIBLE_DEVICES narrows that set). So N engines that each see G GPUs charge N x G x size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops import knowledge
from gpuwarden.ops.config import nodeconfig
from gpuwarden.ops.node.debugfs import parse
from gpuwarden.ops.node.debugfs.reader import DebugfsReader
from gpuwarden.ops.node.sim.node import active_sim_root
from gpuwarden.ops.arena.format import load_header

RESERVE = 3 << 29  # AMDGPU_RESERVE_MEM_LIMIT


def kfd_system_limit(mem_total: int) -> int:
    """KFD's max_system_mem_limit for a machine with `mem_total` bytes of RAM."""
    limit = mem_total - (mem_total >> 6)
    if limit < 2 * RESERVE:
        return limit >> 1
    return limit - RESERVE


def mem_total(proc_root: Path) -> int:
    try:
        text = (proc_root / "meminfo").read_text()
    except OSError as exc:
        raise GpuwardenError(f"cannot read {proc_root / 'meminfo'} ({exc.strerror})",
                             "run on the node itself, or point --proc-root at a captured tree") from None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            return int(parts[1]) * (1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1)
    raise GpuwardenError(f"{proc_root / 'meminfo'} has no MemTotal line", "is that a /proc tree?")


def no_system_mem_limit(sysfs_root: Path) -> bool | None:
    """The amdgpu parameter: True/False, None when amdgpu is not loaded (no such file)."""
    path = sysfs_root / "module" / "amdgpu" / "parameters" / "no_system_mem_limit"
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return value in ("1", "Y", "y")


@dataclass(frozen=True)
class Budget:
    size: int
    engines: int
    visible_gpus: tuple[int, ...]  # GPUs each engine can see
    mem_total: int
    limit: int
    no_limit: bool | None  # the amdgpu parameter; None when amdgpu is not loaded
    charged: int
    charged_own_gpu: int
    fits: bool
    advice: list[str] = field(default_factory=list)
    # From debugfs kfd/mem_limit when readable: what KFD charges now, and where the limit came from.
    kfd_used: int | None = None
    limit_source: str = "computed"
    limit_note: str | None = None  # why the computed limit was used (debugfs unreadable), or where it was read
    crossing: str | None = None  # the registration that crosses the limit, in one sentence
    # Catalog entries (id, title, url): the alternatives (gpuwarden known arena).
    known: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "visible_gpus": list(self.visible_gpus), "advice": list(self.advice)}

    def lines(self) -> list[str]:
        lim = "none (amdgpu.no_system_mem_limit=1)" if self.no_limit else fmt_bytes(self.limit)
        where = (f"read from debugfs: {self.limit_note}" if self.limit_source == "debugfs" else
                 f"computed: RAM {fmt_bytes(self.mem_total)} - 1/64 - 1.5 GiB"
                 + (f"; {self.limit_note}" if self.limit_note else ""))
        out = [
            f"arena {fmt_bytes(self.size)} x {self.engines} engine(s) seeing {_seen(self.visible_gpus)} GPU(s) each",
            f"KFD charges      {fmt_bytes(self.charged)}",
            f"KFD system limit {lim}  ({where})",
        ]
        if self.kfd_used is not None:
            out.append(f"KFD system memory in use now {fmt_bytes(self.kfd_used)} (every process's registrations): "
                       f"these would take it to {fmt_bytes(self.kfd_used + self.charged)}")
        if self.no_limit is None:
            out.append("amdgpu is not loaded here: the limit shown is what it would enforce")
        out.append("verdict: fits" if self.fits else "verdict: DOES NOT FIT — registrations past the limit fail "
                   "(or crash the runtime) once the sum is reached")
        if self.crossing:
            out.append(f"warning: {self.crossing}")
        out += [f"advice: {a}" for a in self.advice]
        if self.known and not self.fits:
            out.append("other ways to share one host buffer (`gpuwarden known ID`): "
                       + "; ".join(f"{k['id']} ({k['title']})" for k in self.known))
        return out


def _seen(visible: tuple[int, ...]) -> str:
    return str(visible[0]) if len(set(visible)) == 1 else "/".join(map(str, visible))


def live_limit(settings: Settings) -> tuple[parse.MemLimit | None, str]:
    """KFD's own numbers from debugfs kfd/mem_limit and the file they came from, or (None, why not)."""
    # The sim node's tree when one stands in for this node's GPUs, else <sysfs root>/kernel/debug.
    sim = active_sim_root(settings) if settings.backend in (None, "sim") else None
    r = DebugfsReader(Path(sim or settings.sysfs_root) / "kernel" / "debug").read("kfd_mem_limit")
    limit = parse.mem_limit(r.data) if r.ok and r.data is not None else None
    if limit is None:
        return None, (r.why() if not r.ok else f"{r.path} is not in kfd_debugfs_kfd_mem_limits' format")
    return limit, r.path


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.0f}"


def crossing_message(size: int, visible: list[int], names: list[str], used: int, limit: int) -> str | None:
    """The first registration, in launch order, that takes KFD system memory over its limit."""
    total = used
    for name, seen in zip(names, visible):
        total += size * seen
        if total > limit:
            gpus = f" (seeing {seen} GPUs: {fmt_bytes(size * seen)} charged)" if seen > 1 else ""
            return (f"engine {name}'s {fmt_bytes(size)} registration{gpus} would take KFD system memory to "
                    f"{_gib(total)}/{_gib(limit)} GiB: it will fail with out of memory; set "
                    f"amdgpu.no_system_mem_limit=1 (runtime-writable) or register less")
    return None


def compute(settings: Settings, size: int, visible_per_engine: list[int], names: list[str] | None = None) -> Budget:
    """The verdict for `len(visible_per_engine)` engines registering `size` bytes, each seeing that many GPUs.

    KFD's own limit and current use come from debugfs kfd/mem_limit when it can be read (root, amdgpu loaded);
    otherwise the limit is computed from RAM the way the driver does, and the result says so."""
    engines = len(visible_per_engine)
    if size <= 0 or engines <= 0 or min(visible_per_engine) <= 0:
        raise GpuwardenError("size, engines and visible GPUs must all be positive",
                             "e.g. --size 64GiB --engines 4 --visible-gpus 4")
    total = mem_total(settings.proc_root)
    limit = kfd_system_limit(total)
    nolimit = no_system_mem_limit(settings.sysfs_root)
    live, note = live_limit(settings)
    used = live.system_used if live else None
    if live:
        limit = live.system_limit
    charged = size * sum(visible_per_engine)
    own = size * engines
    visible_gpus = max(visible_per_engine)
    fits = bool(nolimit) or (used or 0) + charged <= limit
    names = list(names or [])[:engines] + [str(i) for i in range(len(names or []), engines)]
    crossing = None if nolimit else crossing_message(size, list(visible_per_engine), names, used or 0, limit)
    advice: list[str] = []
    if not fits:
        if visible_gpus > 1 and (used or 0) + own <= limit:
            advice.append(f"restrict each engine to its own GPU with ROCR_VISIBLE_DEVICES=<its GPU> (or "
                          f"HIP_VISIBLE_DEVICES; ROCR_ acts below HIP, on every agent ROCr enumerates, so it is the "
                          f"sure one): the charge drops to {fmt_bytes(own)}, which fits")
        elif visible_gpus > 1:
            advice.append(f"even with one GPU per engine (ROCR_VISIBLE_DEVICES) the charge is {fmt_bytes(own)}, "
                          f"over the limit")
        advice.append("or lift the accounting: amdgpu.no_system_mem_limit=1 on the kernel command line (or "
                      "`options amdgpu no_system_mem_limit=1` in /etc/modprobe.d, then reload amdgpu); "
                      "the pages are shared, so the real RAM use is one arena, not the sum")
    if size > total:
        fits = False
        advice.append(f"the arena alone ({fmt_bytes(size)}) is larger than RAM ({fmt_bytes(total)})")
    known = [{"id": e.id, "title": e.title, "url": e.url} for e in knowledge.load().topic("arena-budget")]
    return Budget(size=size, engines=engines, visible_gpus=tuple(visible_per_engine), mem_total=total, limit=limit,
                  no_limit=nolimit, charged=charged, charged_own_gpu=own, fits=fits, advice=advice, kfd_used=used,
                  limit_source="debugfs" if live else "computed", limit_note=note if live else note,
                  crossing=crossing, known=known)


def count_gpus(sysfs_root: Path) -> int | None:
    """GPUs KFD knows (topology nodes with a non-zero gpu_id); None when KFD is absent."""
    nodes = sysfs_root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    try:
        entries = list(nodes.iterdir())
    except OSError:
        return None
    count = 0
    for node in entries:
        try:
            if int((node / "gpu_id").read_text().strip() or 0) != 0:
                count += 1
        except (OSError, ValueError):
            continue
    return count


VISIBILITY_ORDER = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def visible_count(env: dict[str, str]) -> int | None:
    """How many GPUs an engine with this environment sees; None when nothing restricts it."""
    for var in VISIBILITY_ORDER:
        if var in env:
            return len([x for x in env[var].split(",") if x.strip()])
    return None


def engine_names(settings: Settings) -> list[str]:
    """The engines' names in the node config, in launch order (for the crossing warning)."""
    return [e.name for e in nodeconfig.load(settings).engines]


def from_config(settings: Settings, size: int | None = None) -> tuple[int, list[int]]:
    """(arena size, GPUs seen per engine) from the node config; errors say which flag to pass instead.

    An engine with a `gpu` sees only that GPU (its shim narrows the visibility variables to it); others see
    what their env allows, or every GPU KFD knows.
    """
    cfg = nodeconfig.load(settings)
    if size is None:
        if cfg.arena is None:
            raise GpuwardenError(f"node config {settings.config_path} has no [arena] table",
                                 "add one, or pass --size")
        size = cfg.arena.size if cfg.arena.size else load_header(cfg.arena.path).payload_size
    if not cfg.engines:
        raise GpuwardenError(f"node config {settings.config_path} lists no engines", "pass --engines")
    gpus = count_gpus(settings.sysfs_root)
    visible = []
    for engine in cfg.engines:
        n = 1 if engine.gpu is not None else visible_count(engine.env)
        if n is None:
            n = gpus
        if n is None:
            raise GpuwardenError(f"engine {engine.name} sees every GPU, and KFD is not here to count them",
                                 "pass --visible-gpus G")
        visible.append(n)
    return size, visible
