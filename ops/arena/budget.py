"""Budget preflight: what KFD charges against its node-wide system-memory limit for an arena plan.

Registrations are charged once per process; each engine's pinned host allocations draw on the same limit.
Pure arithmetic over /proc/meminfo, the amdgpu parameter and (when readable) debugfs kfd/mem_limit.

Sources (public Linux code, drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd_gpuvm.c, as of Linux 6.8):
- amdgpu_amdkfd_gpuvm_init_mem_limits(): at driver load, mem = totalram; max_system_mem_limit = mem - mem/64,
  then minus AMDGPU_RESERVE_MEM_LIMIT (3 << 29 = 1.5 GiB), or halved instead when that would leave less than
  2 x 1.5 GiB. Older kernels used mem - mem/16 of *free* RAM; debugfs kfd/mem_limit shows what is enforced.
- amdgpu_amdkfd_reserve_mem_limit(), called from amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu() when a memory object
  is created: a USERPTR object (hipHostRegister) charges its size to kfd_mem_limit.system_mem_used, and so does
  a GTT-domain object (HIP's pinned host memory: hipHostMalloc / hipMallocHost / hipExtHostAlloc, ROCr
  system-pool allocations); past the limit it returns -ENOMEM unless no_system_mem_limit is set (its hint
  "Set no_system_mem_limit=1 if using shared memory" is pr_debug). Doorbell/MMIO objects charge nothing.
- kfd_mem_attach(): mapping that object to another GPU of the same process adds an attachment, not a second
  reservation: with IOMMU direct mapping on both devices (iommu=pt; reuse_dmamap()) the original BO is shared
  outright, otherwise create_dmamap_sg_bo() makes an SG BO that DMA-maps the same pages. So the GPUs a process
  sees change the mappings, never the charge.
- drivers/gpu/drm/amd/amdkfd/kfd_svm.c, svm_range_new(): with XNACK off (gfx1100), an SVM range charges its
  size once per range per process through the same function, and prints "SVM mapping failed, exceeds
  resident system memory limit" (pr_info) when it cannot.
The limit is global: every process and every GPU draws from the one counter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.ops.node.debugfs.kfd_limit import computed_limit
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops import knowledge
from gpuwarden.ops.config import nodeconfig
from gpuwarden.ops.node.debugfs import parse
from gpuwarden.ops.node.debugfs.reader import DebugfsReader
from gpuwarden.ops.node.sim.node import active_sim_root
from gpuwarden.ops.arena.format import load_header
from gpuwarden.ops.engines import state as engine_state

RESERVE = 3 << 29  # AMDGPU_RESERVE_MEM_LIMIT


def kfd_system_limit(mem_total: int) -> int:
    """KFD's max_system_mem_limit for a machine with `mem_total` bytes of RAM (one arithmetic for the whole
    product: ops/node/debugfs/kfd_limit.computed_limit, amdgpu_amdkfd_gpuvm_init_mem_limits)."""
    return computed_limit(mem_total)


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


GiB = 1 << 30
# Pinned host memory an engine allocates besides the arena (HIP staging buffers, an engine's pinned I/O and
# verifier buffers, a KV swap space), assumed when neither its last run's ledger nor the node config says.
# A stated guess, not a measurement: set `pinned_headroom` per engine, or run once with progress = "preload".
DEFAULT_PINNED_HEADROOM = 4 * GiB
# An unmeasured headroom decides the verdict only when the room left could not hold this many times the default
# per engine; past that the plan fits whatever the engines pin within reason.
TIGHT_FACTOR = 2


@dataclass(frozen=True)
class Headroom:
    """Pinned host memory an engine is expected to allocate on top of its registration, and where that came from."""
    bytes: int
    source: str  # "ledger" (the engine's last run), "config" (pinned_headroom) or "default"

    def words(self) -> str:
        return {"ledger": "its last run's ledger", "config": "pinned_headroom in the node config",
                "default": "the default, not measured"}.get(self.source, self.source)


def pinned_headroom_for(engine: nodeconfig.EngineConfig | str | None, state_dir: Path | None = None) -> Headroom:
    """The pinned headroom to budget for one engine: its last run's ledger, else the config, else the default.

    The ledger is the interposer's record of pinned allocations (issue 33 item 1): when the engine's state file
    carries `pinned_bytes` (the most it held pinned at once, or what it held last), that measured figure wins.
    """
    name = engine if isinstance(engine, str) else (engine.name if engine is not None else None)
    if name and state_dir is not None:
        measured = _ledger_pinned(state_dir, name)
        if measured is not None:
            return Headroom(measured, "ledger")
    configured = getattr(engine, "pinned_headroom", None)
    if isinstance(configured, int):
        return Headroom(configured, "config")
    return Headroom(DEFAULT_PINNED_HEADROOM, "default")


def _ledger_pinned(state_dir: Path, name: str) -> int | None:
    """Hook for the interposer's ledger: the engine state's peak (or current) pinned bytes, when recorded."""
    try:
        record = engine_state.read_state(state_dir, name) or {}
    except (OSError, GpuwardenError):
        return None
    # The shim keeps the interposer's ledger under "host_ledger" (ops/services/shim.py): the peak pinned at once is
    # what the next run must find room for; the flat keys are what a hand-written or older state file may carry.
    raw = record.get("host_ledger")
    ledger: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for value in (ledger.get("peak_bytes"), ledger.get("pinned_bytes"), record.get("pinned_peak_bytes"),
                  record.get("pinned_bytes")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


@dataclass(frozen=True)
class Budget:
    size: int
    engines: int
    visible_gpus: tuple[int, ...]  # GPUs each engine can see: they change the mappings, not the charge
    mem_total: int
    limit: int
    no_limit: bool | None  # the amdgpu parameter; None when amdgpu is not loaded
    charged: int  # the registrations: size once per engine process
    charged_own_gpu: int  # the same figure (kept for readers of the JSON before issue 33)
    fits: bool  # registrations plus the pinned headroom fit (on the headroom's assumption when not measured)
    advice: list[str] = field(default_factory=list)
    kfd_used: int | None = None
    limit_source: str = "computed"
    limit_note: str | None = None
    crossing: str | None = None  # the allocation that crosses the limit, in one sentence
    known: list[dict[str, str]] = field(default_factory=list)
    pinned: tuple[int, ...] = ()  # pinned headroom per engine
    pinned_sources: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    # "fits", "does-not-fit" (registrations alone exceed the limit), "pinned-does-not-fit" (registrations fit,
    # pinned allocations do not: the incident's sequence) or "decided-by-pinned" (fits only if the pinned
    # headroom assumed holds: not measured)
    verdict: str = "fits"
    left_after_registrations: int = 0
    decides: str | None = None  # what decides the verdict, in one sentence with what confirms it

    @property
    def pinned_total(self) -> int:
        return sum(self.pinned)

    @property
    def registrations_fit(self) -> bool:
        return bool(self.no_limit) or (self.kfd_used or 0) + self.charged <= self.limit

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "visible_gpus": list(self.visible_gpus), "advice": list(self.advice),
                "pinned": list(self.pinned), "pinned_sources": list(self.pinned_sources), "names": list(self.names),
                "pinned_total": self.pinned_total, "registrations_fit": self.registrations_fit}

    def lines(self) -> list[str]:
        lim = "none (amdgpu.no_system_mem_limit=1)" if self.no_limit else f"{gib(self.limit)} GiB"
        where = (f"read from debugfs: {self.limit_note}" if self.limit_source == "debugfs" else
                 f"computed: RAM {fmt_bytes(self.mem_total)} - RAM/64 - 1.5 GiB at driver load, as kernels since "
                 f"the late-2023 change do; older kernels took RAM/16 off free RAM, so the sources disagree by "
                 f"kernel: debugfs kfd/mem_limit (root) shows the figure enforced here"
                 + (f"; {self.limit_note}" if self.limit_note else ""))
        seen = _seen(self.visible_gpus)
        out = [
            f"arena {fmt_bytes(self.size)} x {self.engines} engine(s), each seeing {seen} GPU(s)",
            f"KFD charges      {fmt_bytes(self.charged)} for the registrations (once per process: the other GPUs "
            f"a process sees get DMA mappings of the same pages, not a second charge)",
            f"KFD system limit {lim}  ({where})",
            f"pinned headroom  {fmt_bytes(self.pinned_total)} ({_headroom_words(self)})",
        ]
        if self.kfd_used is not None:
            out.append(f"KFD system memory in use now {fmt_bytes(self.kfd_used)} (every process's registrations and "
                       f"pinned allocations): the registrations would take it to "
                       f"{fmt_bytes(self.kfd_used + self.charged)}")
        if self.no_limit is None:
            out.append("amdgpu is not loaded here: the limit shown is what it would enforce")
        out.append("verdict: " + _verdict_words(self))
        if self.decides:
            out.append(f"what decides it: {self.decides}")
        if self.crossing:
            out.append(f"warning: {self.crossing}")
        out += [f"advice: {a}" for a in self.advice]
        if self.known and not self.fits:
            out.append("other ways to share one host buffer (`gpuwarden known ID`): "
                       + "; ".join(f"{k['id']} ({k['title']})" for k in self.known))
        return out


def _headroom_words(b: Budget) -> str:
    sources = sorted(set(b.pinned_sources))
    each = (f"{fmt_bytes(b.pinned[0])} per engine" if len(set(b.pinned)) == 1 and b.pinned
            else ", ".join(f"{n} {fmt_bytes(p)}" for n, p in zip(b.names, b.pinned)))
    from_ = "; ".join({"ledger": "measured by the interposer's ledger", "config": "pinned_headroom in the node config",
                       "default": f"the default {fmt_bytes(DEFAULT_PINNED_HEADROOM)}, not measured"}[s] for s in sources)
    return f"{each}: {from_}"


def _verdict_words(b: Budget) -> str:
    if b.no_limit:
        return "fits (no_system_mem_limit=1: KFD does not count host memory)"
    assumed = (" (on the default headroom, not measured: confirm with the ledger)"
               if b.verdict == "pinned-does-not-fit" and "default" in b.pinned_sources else "")
    return {
        "fits": "fits",
        "does-not-fit": "DOES NOT FIT: the registrations alone exceed the limit; the one that crosses it fails "
                        "(hipErrorInvalidValue in today's HIP, hipErrorOutOfMemory in older releases); confirm on "
                        "this node: /sys/kernel/debug/kfd/mem_limit (root) reaches the limit as the engines register",
        "pinned-does-not-fit": "DOES NOT FIT: every registration fits, then the engines' pinned allocations "
                               "cross the limit; the first that does fails (the arena incident's sequence)",
        "decided-by-pinned": "fits by registrations alone; NOT CERTAIN: it fits only if the pinned allocations "
                             "stay within the headroom assumed",
    }[b.verdict] + assumed


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


def gib(n: int) -> str:
    """Bytes as GiB with up to two decimals, trailing zeros dropped: 121.55, 100, 21.5."""
    return f"{n / GiB:.2f}".rstrip("0").rstrip(".")


def crossing_message(size: int, names: list[str], used: int, limit: int, pinned: list[int] | None = None) -> str | None:
    """The first allocation, in launch order, that takes KFD system memory over its limit.

    Registrations first (each engine registers, then loads), then each engine's pinned allocations."""
    total = used
    for name in names:
        total += size
        if total > limit:
            return (f"engine {name}'s {fmt_bytes(size)} registration would take KFD system memory to "
                    f"{gib(total)}/{gib(limit)} GiB: KFD refuses it (-ENOMEM) and HIP returns hipErrorInvalidValue "
                    f"(\"Cannot create memory for size\" at AMD_LOG_LEVEL>=1; older HIP said hipErrorOutOfMemory); "
                    f"set amdgpu.no_system_mem_limit=1 (runtime-writable) or register less")
    for name, extra in zip(names, pinned or []):
        if extra and total + extra > limit:
            return (f"every registration fits ({gib(total)}/{gib(limit)} GiB), then engine {name}'s pinned "
                    f"allocations ({fmt_bytes(extra)}) would cross the limit: that hipHostMalloc-style call fails "
                    f"after the engine is up; confirm with the ledger's failed calls (`gpuwarden engines list`) or "
                    f"AMD_LOG_LEVEL=1 in its log")
        total += extra
    return None


def compute(settings: Settings, size: int, visible_per_engine: list[int], names: list[str] | None = None,
            pinned: list[Headroom] | None = None) -> Budget:
    """The verdict for `len(visible_per_engine)` engines registering `size` bytes each, plus their pinned headroom.

    `pinned` gives each engine's headroom; by default pinned_headroom_for() of the engine of that name in the node
    config (its ledger, its pinned_headroom, or the default). KFD's own limit and current use come from debugfs
    kfd/mem_limit when it can be read (root, amdgpu loaded); otherwise the limit is computed from RAM."""
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
    names = list(names or [])[:engines] + [str(i) for i in range(len(names or []), engines)]
    if pinned is None:
        pinned = _configured_headroom(settings, names)
    pinned = (list(pinned) + [Headroom(DEFAULT_PINNED_HEADROOM, "default")] * engines)[:engines]
    charged = size * engines  # once per process, whatever it sees (kfd_mem_attach: no second reservation)
    base = used or 0
    left = limit - base - charged
    extra = sum(h.bytes for h in pinned)
    measured = all(h.source != "default" for h in pinned)
    if nolimit:
        verdict = "fits"
    elif left < 0:
        verdict = "does-not-fit"
    elif extra > left:
        verdict = "pinned-does-not-fit"
    elif measured or left >= engines * TIGHT_FACTOR * DEFAULT_PINNED_HEADROOM:
        verdict = "fits"  # measured, or room for every engine to pin several times the default
    else:
        verdict = "decided-by-pinned"
    fits = verdict in ("fits", "decided-by-pinned")
    crossing = None if nolimit else crossing_message(size, names, base, limit, [h.bytes for h in pinned])
    decides = None
    if not nolimit and verdict != "does-not-fit":
        share = left // engines
        decides = (f"after the registrations ({gib(charged)} of {gib(limit)} GiB"
                   + (f", with {gib(base)} GiB already in use" if base else "")
                   + f"), the {gib(left)} GiB left must hold every engine's pinned allocations (hipHostMalloc, "
                   f"hipMallocHost, hipExtHostAlloc, ROCr system-pool buffers): {gib(share)} GiB each across "
                   f"{engines} engine(s), against {gib(extra)} GiB assumed; confirm with each engine's pinned bytes "
                   f"and failed calls in the interposer's ledger (`gpuwarden engines list`, progress = \"preload\") "
                   f"and KFD's used/limit in debugfs kfd/mem_limit")
    advice: list[str] = []
    visible_gpus = max(visible_per_engine)
    if not fits:
        if visible_gpus > 1:
            advice.append("restricting each engine to its own GPU (ROCR_VISIBLE_DEVICES) does not lower this charge: "
                          "KFD charges a registration once per process, whatever it sees; it only drops the other "
                          "GPUs' mappings")
        if verdict == "pinned-does-not-fit":
            advice.append(f"register less or run fewer engines so {gib(extra)} GiB of pinned allocations fit, or "
                          f"lower what each engine pins (measure it: progress = \"preload\" records every pinned "
                          f"allocation)")
        advice.append("or lift the accounting: amdgpu.no_system_mem_limit=1 on the kernel command line (or "
                      "`options amdgpu no_system_mem_limit=1` in /etc/modprobe.d, then reload amdgpu); "
                      "the pages are shared, so the real RAM use is one arena, not the sum")
    if size > total:
        fits = False
        verdict = "does-not-fit"
        advice.append(f"the arena alone ({fmt_bytes(size)}) is larger than RAM ({fmt_bytes(total)})")
    known = [{"id": e.id, "title": e.title, "url": e.url} for e in knowledge.load().topic("arena-budget")]
    return Budget(size=size, engines=engines, visible_gpus=tuple(visible_per_engine), mem_total=total, limit=limit,
                  no_limit=nolimit, charged=charged, charged_own_gpu=charged, fits=fits, advice=advice,
                  kfd_used=used, limit_source="debugfs" if live else "computed", limit_note=note,
                  crossing=crossing, known=known, pinned=tuple(h.bytes for h in pinned),
                  pinned_sources=tuple(h.source for h in pinned), names=tuple(names), verdict=verdict,
                  left_after_registrations=left, decides=decides)


def _configured_headroom(settings: Settings, names: list[str]) -> list[Headroom]:
    """pinned_headroom_for() each named engine of the node config; the default for names it lacks."""
    by_name: dict[str, nodeconfig.EngineConfig] = {}
    if settings.config_path.exists():
        try:
            by_name = {e.name: e for e in nodeconfig.load(settings).engines}
        except GpuwardenError:
            by_name = {}
    return [pinned_headroom_for(by_name.get(n) or n, settings.state_dir) for n in names]


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
