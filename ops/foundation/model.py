"""Immutable records that make up one NodeSnapshot, and their JSON form (schema gpuwarden.snapshot/1).

Every field is plain data (ints in bytes, floats in seconds since the epoch, each time with an ISO-8601
twin in JSON), so a snapshot serialises with `to_json` and reads back with `snapshot_from_dict`.
"""

from __future__ import annotations

import json

from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.records import field, field_names, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (3 ms of every `status`)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    _R = TypeVar("_R")

# Process states as the kernel's /proc/<pid>/stat letter maps to them.
PROC_STATES = {
    "R": "running", "S": "sleeping", "D": "disk-sleep", "Z": "zombie",
    "T": "stopped", "t": "tracing-stop", "X": "dead", "I": "idle",
    "P": "parked", "W": "paging",
}


@record
class StaleRead:
    """A read of a GPU source that did not answer within its deadline (gpuwarden.ops.foundation.deadline): the GPU is STALE."""

    source: str  # "sysfs", "kfd", "amdsmi", "nvml"
    what: str  # the file's name (gpu_busy_percent) or the library call (nvmlDeviceGetUtilizationRates)
    path: str | None  # the file read, when it is one
    deadline_s: float
    since: float  # seconds since the epoch: when the read that has not answered began
    message: str  # "GPU 2: sysfs read of gpu_busy_percent did not answer in 3 s: the GPU may be hung"
    gpu: int | None = None


def stale_read(late: Any) -> StaleRead:
    """The record of a gpuwarden.ops.foundation.deadline.LateRead."""
    return StaleRead(source=late.source, what=late.what, path=late.path, deadline_s=late.deadline_s,
                     since=late.since, message=late.message, gpu=late.gpu)


@record
class GpuSensors:
    """The sensors of one GPU beyond VRAM/busy/temperature/power; None (shown "n/a") where the source lacks one.

    Clocks in MHz, power in W, PCIe speed in GT/s, temperatures in degrees C by sensor ("edge", "junction",
    "memory"; NVIDIA: "gpu", "memory"). RAS/ECC: per block {"ce": corrected, "ue": uncorrected[, "de": deferred]}.
    """

    sclk_mhz: float | None = None
    sclk_max_mhz: float | None = None
    mclk_mhz: float | None = None
    mclk_max_mhz: float | None = None
    fan_rpm: int | None = None
    fan_percent: float | None = None
    power_cap_w: float | None = None
    mem_busy_percent: float | None = None  # memory-controller activity
    link_speed_gts: float | None = None
    link_max_speed_gts: float | None = None
    link_width: int | None = None
    link_max_width: int | None = None
    # Why clocks are held down right now: () when nothing throttles, None when the source does not say.
    throttle: tuple[str, ...] | None = None
    temperatures: dict[str, float] = field(default_factory=dict)
    ras: dict[str, dict[str, int]] = field(default_factory=dict)  # block -> counts; {} when none exposed
    ecc_corrected: int | None = None  # totals over the blocks (NVIDIA: volatile ECC counts)
    ecc_uncorrected: int | None = None
    retired_pages: int | None = None  # AMD: bad pages retired; NVIDIA: retired pages or remapped rows
    pending_pages: int | None = None  # waiting to be retired (at the next reset/reboot)
    bad_page_threshold: int | None = None  # retired pages at which the GPU is flagged for RMA; None: not set


@record
class GpuInfo:
    """One GPU as a backend sees it. Sizes in bytes; None where the vendor gives nothing."""

    index: int
    name: str
    vendor: str  # "amd", "nvidia" or "sim"
    bus_id: str | None = None
    uuid: str | None = None
    vram_total: int | None = None
    vram_used: int | None = None
    gtt_total: int | None = None
    gtt_used: int | None = None
    busy_percent: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    # AMD: KFD's gpu_id, the key of /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>.
    kfd_gpu_id: int | None = None
    # AMD: XGMI hive id; GPUs of one hive can be reached by one reset.
    hive_id: str | None = None
    # Device files a process holds to use this GPU (render node, /dev/nvidiaN).
    device_files: tuple[str, ...] = ()
    # Set when a read of this GPU did not answer in time: the fields it would have given are None (STALE).
    stale: StaleRead | None = None
    sensors: GpuSensors | None = None  # None: the backend reads no sensors beyond the fields above
    # MI300-class partition modes of the physical device this GPU is (a part of): "SPX".."CPX", "NPS1".."NPS8";
    # the logical GPUs of one physical device share its bus_id.
    compute_partition: str | None = None
    memory_partition: str | None = None


@record
class ProcessUsage:
    """VRAM a backend attributes to one host PID on one GPU, and where the number came from."""

    pid: int
    gpu_index: int
    vram_bytes: int
    source: str  # e.g. "kfd", "fdinfo", "nvml", "amdsmi", "sim"
    gtt_bytes: int | None = None


@record
class GpuProcess:
    """A process that uses a GPU (by the backend's account or by holding its device files)."""

    pid: int
    start_time: float | None  # seconds since the epoch; with pid, a process's identity
    user: str | None
    command: str
    state: str  # one of PROC_STATES' values, or "gone" when /proc has no entry
    ppid: int | None = None
    cgroup: str | None = None
    container: str | None = None
    vram: dict[int, int] = field(default_factory=dict)  # gpu index -> bytes
    sources: dict[int, str] = field(default_factory=dict)  # gpu index -> source
    device_files: tuple[str, ...] = ()  # GPU device files it holds open
    # GPU visibility variables (HIP/ROCR/CUDA_VISIBLE_DEVICES) only; nothing else of environ.
    visible_devices: dict[str, str] = field(default_factory=dict)
    # Kubernetes (agent --kubernetes): the pod and container (by name) the process runs in.
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    container_name: str | None = None

    @property
    def alive(self) -> bool:
        """True for a process that can still free what it holds by itself."""
        return self.state not in ("zombie", "dead", "gone")


@record
class GpuLoad:
    """One process's load on one GPU over the last refresh interval (ops/sampling/procload.py)."""

    percent: float | None  # AMD: gfx + compute busy time / wall time (DRM fdinfo); NVIDIA: SM utilisation
    # engine -> percent over the interval. AMD: gfx, compute, dma, dec, enc, jpeg (drm-engine-*, each divided by
    # its capacity); NVIDIA: sm, mem, enc, dec (nvmlDeviceGetProcessUtilization)
    engines: dict[str, float] = field(default_factory=dict)
    engine_ns: dict[str, int] = field(default_factory=dict)  # AMD: busy ns per engine since its clients opened
    clients: int = 0  # AMD: distinct DRM clients counted here (by drm-pdev + drm-client-id)
    vram_bytes: int | None = None  # AMD: drm-memory-vram of those clients
    # Other PIDs that show the same DRM clients (a fork kept the fd): their time is counted here, once.
    shared_with: tuple[int, ...] = ()


@record
class ProcessLoad:
    """A process's host and GPU load over the last refresh interval; None where one sample is all there is."""

    pid: int
    cpu_percent: float | None = None  # of one core, as top counts it (200: two cores busy)
    cpu_time_s: float | None = None  # user + system time since it started
    rss_bytes: int | None = None
    threads: int | None = None
    gpus: dict[int, GpuLoad] = field(default_factory=dict)  # gpu index -> its load there
    source: str | None = None  # "fdinfo" (AMD), "nvml"; None: the backend gives no per-process GPU time

    @property
    def gpu_percent(self) -> float | None:
        """The busiest of its GPUs (the GPU% column), None when no source says."""
        values = [g.percent for g in self.gpus.values() if g.percent is not None]
        return max(values) if values else None


@record
class Holder:
    """Something that keeps VRAM or a GPU device file after its owner should have let go."""

    pid: int | None
    start_time: float | None
    reason: str  # "zombie", "disk-sleep", "dead", "kfd-without-process", "ownerless", "gem-buffers" (debugfs)
    gpus: tuple[int, ...]
    vram_bytes: int | None
    command: str | None = None
    ppid: int | None = None
    detail: str = ""
    # Kubernetes: the pod it belonged to, and when that pod was deleted (None while it exists).
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    container_name: str | None = None
    pod_deleted_at: float | None = None


@record
class Residual:
    """VRAM on one GPU that no live process accounts for."""

    gpu_index: int
    device_used: int | None
    accounted: int  # sum of live processes' VRAM on this GPU
    baseline: int | None  # idle use recorded by `baseline record`; None when not recorded
    residual: int | None  # device_used - accounted - (baseline or 0); None when unknown
    holders: tuple[Holder, ...] = ()
    significant: bool = False  # above the tolerance, worth the operator's attention


@record
class Registration:
    """One host-registration call of an engine, as the interposer (or the engine itself) reported it."""

    kind: str  # "register" or "unregister"
    call: str | None  # hipHostRegister, cudaHostRegister, cuMemHostRegister, ...; None when not said
    bytes: int | None
    outcome: str  # running, registered, failed, hung (its gate slot was let go), died (with the engine)
    started_at: float | None
    seconds: float | None = None  # the call itself, without the wait for the gate
    wait_s: float | None = None  # waiting for a gate slot before the call
    result: int | None = None  # the call's return value (0: success)
    pid: int | None = None
    via: str | None = None  # how the engine reached the call: symbol, dlsym, procaddress, deepbind, engine


@record
class HostCall:
    """One pinned host allocation or free the interposer wrote a line for (failed, or of the ledger threshold or more)."""

    kind: str  # "alloc", "free", or "register" (a failed host registration, from the registration records)
    call: str | None  # hipHostMalloc, cudaHostAlloc, cuMemFreeHost, hipHostRegister, ...
    bytes: int | None
    result: int | None  # the call's return value (0: success)
    ts: float | None = None  # when it returned (seconds since the epoch)
    seconds: float | None = None  # the call itself
    flags: int | None = None  # None: the call takes none (hipMallocHost, cudaMallocHost, frees)
    pid: int | None = None
    via: str | None = None  # symbol, dlsym, procaddress, deepbind


@record
class HostLedger:
    """The KFD ledger of an engine's current (or last) run: its pinned host memory, summed over its processes.

    KFD charges pinned host memory against the same system-memory limit as registrations (amdgpu_amdkfd_gpuvm.c,
    amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu -> amdgpu_amdkfd_reserve_mem_limit), once per process."""

    pinned_bytes: int = 0  # live at the last report
    peak_bytes: int = 0  # the most live at once, per process, summed (an upper bound across processes)
    pinned_count: int = 0
    allocs: int = 0
    frees: int = 0
    failed: int = 0  # pinned calls that returned an error in this run
    processes: int = 0  # engine processes that reported pinned calls
    untracked: int = 0  # allocations the interposer's pointer table had no room for (their frees are not seen)
    unknown_frees: int = 0  # frees of pointers no interposed call allocated
    failures: tuple[HostCall, ...] = ()  # the newest failed calls, restarts included, newest last
    updated_at: float | None = None


@record
class PodGpus:
    """Kubernetes: GPUs the kubelet assigned to one container of a pod (pod-resources API)."""

    namespace: str
    pod: str
    container_name: str
    gpus: tuple[int, ...]
    pod_uid: str | None = None
    deleted_at: float | None = None  # the pod is gone (watch), its GPUs may still hold its memory


# The phase of an engine whose host-registration call returned an error (ops/engines/progress.py keeps it there until
# a registration succeeds or the engine stops); it and "crashed" put the node in NEEDS ATTENTION.
FAILED_REGISTRATION = "failed-registration"
ATTENTION_PHASES = ("crashed", FAILED_REGISTRATION)


@record
class EngineInfo:
    """A supervised engine as its shim last recorded it."""

    name: str
    gpu: int | None
    # waiting (held at the gate), starting, mapping, verifying, registering, registered, serving,
    # stopping, exited, crashed, stale
    phase: str
    pid: int | None = None
    shim_pid: int | None = None
    started_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    core_dumped: bool | None = None
    restarts: int = 0
    log_path: str | None = None
    last_log_line: str | None = None
    bundle: str | None = None
    stale: bool = False  # the state file's shim is gone: nothing here can be trusted
    registrations: tuple[Registration, ...] = ()  # newest last
    phase_since: float | None = None  # when it entered `phase` (the shim's record); None when unknown
    crashes: dict[str, int] = field(default_factory=dict)  # signal name ("none": exit code) -> crashes so far
    host_ledger: HostLedger | None = None  # None: no interposer report of pinned host memory (yet)

    # --- the KFD ledger, read by the budget (ops/arena/budget.py) and shown by engines list, status, metrics ---
    @property
    def registered_bytes(self) -> int | None:
        """Bytes the current (last) run registered successfully; None when no registration was reported."""
        run = self.last_run_registrations()
        if not run:
            return None
        return sum(r.bytes or 0 for r in run if r.kind == "register" and r.outcome == "registered")

    @property
    def pinned_bytes(self) -> int | None:
        """Pinned host memory live at the interposer's last report; None when it reported none."""
        return self.host_ledger.pinned_bytes if self.host_ledger is not None else None

    @property
    def pinned_peak_bytes(self) -> int | None:
        """The most pinned host memory the current (last) run held at once: the headroom it needs under the limit."""
        return self.host_ledger.peak_bytes if self.host_ledger is not None else None

    @property
    def failed_calls(self) -> tuple[HostCall, ...]:
        """The newest failed host calls, registrations and pinned allocations/frees together, oldest first."""
        regs = tuple(HostCall(kind=r.kind, call=r.call, bytes=r.bytes, result=r.result,
                              ts=(r.started_at + (r.seconds or 0.0)) if r.started_at is not None else None,
                              seconds=r.seconds, pid=r.pid, via=r.via)
                     for r in self.registrations if r.outcome == "failed")
        pinned = self.host_ledger.failures if self.host_ledger is not None else ()
        return tuple(sorted(regs + pinned, key=lambda c: c.ts or 0.0))[-8:]

    @property
    def failed_call_count(self) -> int:
        """Failed host calls of the current (last) run: registrations that failed and failed pinned calls."""
        regs = sum(1 for r in self.last_run_registrations() if r.outcome == "failed")
        return regs + (self.host_ledger.failed if self.host_ledger is not None else 0)

    def last_run_registrations(self) -> list[Registration]:
        """The registration records of the current (or last) run: those of its newest pid."""
        records = self.registrations
        if not records:
            return []
        pid = self.pid if any(r.pid == self.pid for r in records) else records[-1].pid
        return [r for r in records if r.pid == pid]


@record
class ArenaMapper:
    """A process that has an arena file mapped."""

    pid: int
    command: str
    rss_bytes: int | None
    pss_bytes: int | None
    registered: bool | None = None  # from the status protocol; None when unknown
    gpu: int | None = None  # the node's GPU number (not the index inside the process)


@record
class ArenaInfo:
    path: str
    size: int | None
    header_state: str  # one of gpuwarden.ops.arena.format.STATES: "ok", "missing", "bad-magic", "truncated", ...
    mappers: tuple[ArenaMapper, ...] = ()


# Every code a snapshot warning can carry, and what it means (the schema lists the same codes).
WARNING_CODES = {
    "simulated": "the node is the simulated one (a demo or a test), not real GPUs",
    "no-baseline": "no idle baseline recorded: residual counts all unexplained VRAM",
    "pid-namespace": "gpuwarden runs inside a PID namespace: driver PIDs do not match its /proc",
    "residual-unknown": "the driver did not say how much VRAM some processes use on a GPU",
    "ownerless-leak": "VRAM held by no live process and no holder: only a GPU reset clears it",
    "engine-state-unreadable": "an engine state file could not be read",
    "arena-state-unreadable": "the arena could not be inspected",
    "config-unusable": "the node config exists but does not load",
    "state-file-corrupt": "the idle baseline or the drained-GPU file is corrupt and was ignored",
    "stale": "the snapshot is older than its sampling interval says it should be (a backend call hangs), or a "
             "read of a GPU source did not answer within its deadline (the warning's gpu names the GPU)",
    "kubernetes": "Kubernetes mode: the API server, the pod watch or the kubelet's pod-resources socket is not "
                  "answering as it should (or RBAC refuses a verb)",
    "other": "a warning without a code of its own",
}


@record
class SnapshotWarning:
    """Something the operator should know about a snapshot: a stable `code` for scripts, a `message` for people."""

    code: str  # one of WARNING_CODES
    message: str
    gpu: int | None = None  # the GPU it is about, when one

    def __str__(self) -> str:
        return self.message


def as_warning(item: "SnapshotWarning | str | dict[str, Any]") -> SnapshotWarning:
    """A SnapshotWarning from one, from a plain message (older code and bundles) or from its JSON form."""
    if isinstance(item, SnapshotWarning):
        return item
    if isinstance(item, dict):
        code = item.get("code")
        return SnapshotWarning(code=code if code in WARNING_CODES else "other", message=str(item.get("message", "")),
                               gpu=item.get("gpu"))
    text = str(item)
    return SnapshotWarning("simulated" if text.startswith("SIMULATED") else "other", text)


@record
class NodeSnapshot:
    """Everything gpuwarden knows about the node at one moment; `status --json` prints it."""

    taken_at: float
    hostname: str
    backend: str
    simulated: bool
    gpus: tuple[GpuInfo, ...]
    processes: tuple[GpuProcess, ...]
    residual: tuple[Residual, ...]
    engines: tuple[EngineInfo, ...] = ()
    arenas: tuple[ArenaInfo, ...] = ()
    drained: tuple[int, ...] = ()
    warnings: tuple[SnapshotWarning, ...] = ()
    baseline_recorded: bool = False
    source: str = "live"  # "live", or "bundle:<path>" for a replay
    duration_s: float | None = None
    pods: tuple[PodGpus, ...] = ()  # Kubernetes mode only
    # Kubernetes mode: what the agent last told the API server about this node (gpuwarden.ops.services.k8s_node.KubernetesNode.status).
    kubernetes: dict[str, Any] | None = None
    # Set when the node agent served this snapshot: {"pid", "interval_s", "age_s", "stale", "socket"}.
    agent: dict[str, Any] | None = None
    # AMD: the driver's own books from debugfs (ops/node/debugfs/books.py): KFD system memory used/limit, VRAM free
    # space per GPU; None where not read (NVIDIA, a replay, no debugfs).
    driver: dict[str, Any] | None = None
    # pid -> host CPU, RSS and GPU time over the interval, a table of its own so the process records stay the same
    # objects refresh after refresh; JSON carries each one inside its process record ("load").
    process_load: dict[int, ProcessLoad] = field(default_factory=dict)
    # AMD sysfs: when the oldest per-process VRAM figure in `processes` was read from KFD (the files are re-read in
    # turns, ops/node/backends/sysfs.py VRAM_SPREAD): about taken_at when all were read now; None: not from KFD.
    # JSON carries it in each GPU record as processes_vram_checked_at (the top level is closed to older readers).
    process_vram_checked_at: float | None = None

    def __post_init__(self) -> None:
        if any(not isinstance(w, SnapshotWarning) for w in self.warnings):
            object.__setattr__(self, "warnings", tuple(as_warning(w) for w in self.warnings))

    def gpu(self, index: int) -> GpuInfo | None:
        return next((g for g in self.gpus if g.index == index), None)

    def stale_gpus(self) -> list[GpuInfo]:
        """The GPUs whose driver did not answer a read in time."""
        return [g for g in self.gpus if g.stale is not None]

    def needs_attention(self) -> bool:
        """True when the operator should look: residual VRAM, dead holders, crashed engines, engines whose
        registration failed (until one succeeds or the engine is stopped), a GPU that does not answer."""
        if any(r.significant or r.holders for r in self.residual) or any(g.stale is not None for g in self.gpus):
            return True
        return any(e.phase in ATTENTION_PHASES for e in self.engines)

    def warning_codes(self) -> set[str]:
        return {w.code for w in self.warnings}

    def to_dict(self) -> dict[str, Any]:
        """The gpuwarden.snapshot/1 document: every field, an ISO-8601 twin beside each time, needs_attention."""
        return self._document(with_processes=True)

    def _document(self, with_processes: bool) -> dict[str, Any]:
        """to_dict(); without the process records when to_json writes them from their own cached JSON (2,000 of
        them made into dicts, each load parsed back, only to be dropped, was most of a big node's to_json)."""
        body = _plain(self, skip="" if with_processes else "processes")
        if not with_processes:
            body["processes"] = _PROCESSES_MARK
        driver = body.pop("driver", None)
        for optional in ("agent", "kubernetes"):
            if body.get(optional) is None:
                body.pop(optional, None)
        loads = self.process_load
        if loads and with_processes:
            for p in body["processes"]:
                load = loads.get(p["pid"])
                if load is not None:
                    p["load"] = json.loads(_load_json(load))
        if driver:
            for g in body["gpus"]:
                g["driver"] = gpu_driver_books(driver, g["index"])
        devices = physical_devices(self.gpus)
        if devices:
            for g in body["gpus"]:
                g["physical_device"] = physical_device_of(devices, g["bus_id"], g["index"])
        for e, out in zip(self.engines, body["engines"]):
            out["ledger"] = engine_ledger(e)
        checked = body.pop("process_vram_checked_at", None)
        if checked is not None:  # inside each GPU record (open), not at the closed top level older readers check
            for g in body["gpus"]:
                g["processes_vram_checked_at"], g["processes_vram_checked_at_iso"] = checked, iso(checked)
        body["needs_attention"] = self.needs_attention()
        return document("snapshot", body)

    def to_json(self, indent: int | None = None) -> str:
        """The document as JSON: compact (each unchanged process's JSON reused) unless an indent is asked for."""
        if indent is not None:
            return json.dumps(self.to_dict(), indent=indent, sort_keys=False)
        doc = self._document(with_processes=False)
        text = json.dumps(doc, separators=(",", ":"))
        # The key and a string value are what json.dumps writes for the mark: no other text can look like it.
        spot = f'"processes":{json.dumps(_PROCESSES_MARK)}'
        loads = self.process_load
        return text.replace(spot, '"processes":[' + ",".join(_process_json(p, loads.get(p.pid))
                                                            for p in self.processes) + "]", 1)


def plain(obj: Any) -> Any:
    """A model record as JSON-ready data, with `<time>_iso` beside each epoch time (what documents carry)."""
    return _plain(obj)


_PROCESSES_MARK = "\u0000processes"


def _process_json(p: "GpuProcess", load: "ProcessLoad | None" = None) -> str:
    """One process as compact JSON, made once per GpuProcess object (a sampler reuses unchanged ones), with its
    load of this refresh put inside as "load"."""
    cached = p.__dict__.get("_json_cache")
    if cached is None:
        cached = json.dumps(_plain(p), separators=(",", ":"))
        object.__setattr__(p, "_json_cache", cached)
    if load is None:
        return cached
    joined = load.__dict__.get("_joined")  # an idle process keeps both objects: its record with load, made once
    if joined is not None and joined[0] is p:
        return str(joined[1])
    text = cached[:-1] + ',"load":' + _load_json(load) + "}"
    object.__setattr__(load, "_joined", (p, text))
    return text


def _load_json(load: "ProcessLoad") -> str:
    """A process's "load" object (its pid is the record's), made once per ProcessLoad (an idle one is reused)."""
    cached = load.__dict__.get("_json_cache")
    if cached is None:
        body = _plain(load)
        body.pop("pid", None)
        body["gpu_percent"] = load.gpu_percent
        cached = json.dumps(body, separators=(",", ":"))
        object.__setattr__(load, "_json_cache", cached)
    return cached


def physical_devices(gpus: tuple[GpuInfo, ...]) -> dict[str, list[int]]:
    """bus id -> the logical GPUs that are partitions of that one physical device (MI300 DPX..CPX: two or more
    share its PCI address), in index order; {} on a node without partitions."""
    by_bus: dict[str, list[int]] = {}
    for g in gpus:
        if g.bus_id:
            by_bus.setdefault(g.bus_id, []).append(g.index)
    return {bus: sorted(members) for bus, members in by_bus.items() if len(members) > 1}


def physical_device_of(devices: dict[str, list[int]], bus_id: str | None, index: int) -> dict[str, Any] | None:
    """What a GPU record carries as "physical_device": the device it is a partition of (None: it is one by itself)."""
    members = devices.get(bus_id) if bus_id else None
    if not members:
        return None
    return {"bus_id": bus_id, "partition": members.index(index), "gpus": list(members), "reset_scope": "device"}


def gpu_driver_books(driver: dict[str, Any], index: int) -> dict[str, Any]:
    """The driver's books as one GPU record carries them ("driver"): its VRAM free space, and KFD's system memory
    limit, which is node-wide (the same on every GPU: registrations through any GPU count against it)."""
    free = next((dict(v) for v in driver.get("vram_free") or () if v.get("gpu") == index), None)
    if free is not None:
        free.pop("gpu", None)
    out = {"debugfs": driver.get("debugfs"), "kfd_mem_limit": driver.get("kfd_mem_limit"),
           "kfd_mem_limit_unavailable": driver.get("kfd_mem_limit_unavailable"), "vram_free": free,
           "vram_free_unavailable": None if free is not None else driver.get("vram_free_unavailable")}
    if driver.get("kfd_mem_limit_computed") is not None:
        out["kfd_mem_limit_computed"] = driver["kfd_mem_limit_computed"]
    return out


def _driver_from_gpus(gpus: list[dict[str, Any]]) -> dict[str, Any] | None:
    """NodeSnapshot.driver again from the per-GPU "driver" blocks of a document."""
    blocks = [(g.get("index"), g["driver"]) for g in gpus if isinstance(g.get("driver"), dict)]
    if not blocks:
        return None
    first = blocks[0][1]
    free = [{"gpu": i, **b["vram_free"]} for i, b in blocks if isinstance(b.get("vram_free"), dict)]
    return {"debugfs": first.get("debugfs"), "kfd_mem_limit": first.get("kfd_mem_limit"),
            "kfd_mem_limit_unavailable": first.get("kfd_mem_limit_unavailable"), "vram_free": free,
            "vram_free_unavailable": None if free else first.get("vram_free_unavailable"),
            "kfd_mem_limit_computed": first.get("kfd_mem_limit_computed")}


def _loads(processes: list[dict[str, Any]]) -> dict[int, ProcessLoad]:
    out: dict[int, ProcessLoad] = {}
    for p in processes:
        load = p.get("load")
        if not isinstance(load, dict) or "pid" not in p:
            continue
        try:  # a replayed bundle's document may be damaged: a load that does not read is left out
            gpus = {int(k): _build(GpuLoad, {**v, "shared_with": tuple(v.get("shared_with", ()))})
                    for k, v in (load.get("gpus") or {}).items() if isinstance(v, dict)}
            out[p["pid"]] = _build(ProcessLoad, {**load, "pid": p["pid"], "gpus": gpus})
        except (TypeError, ValueError, AttributeError):
            continue
    return out


# Fields holding seconds since the epoch: JSON gets `<name>_iso` beside each.
TIME_FIELDS = frozenset({"taken_at", "start_time", "started_at", "phase_since", "deleted_at", "pod_deleted_at",
                         "since"})


def _plain(obj: Any, skip: str = "") -> Any:
    names = getattr(type(obj), "__record_fields__", None)
    if names is not None:
        # A sampler hands out the same GpuProcess while nothing about it changed: convert it once.
        cached = obj.__dict__.get("_plain_cache")
        if cached is not None:
            return dict(cached)  # a copy: a reader that edits its document must not edit the next one
        out: dict[str, Any] = {}
        for name in names:
            if name == "process_load" or name == skip:
                continue  # a side table: to_dict puts each entry inside its process record
            value = getattr(obj, name)
            out[name] = value if value is None or isinstance(value, (str, int, float)) else _plain(value)
            if name in TIME_FIELDS:
                out[name + "_iso"] = iso(value)
        if type(obj) is GpuProcess:
            object.__setattr__(obj, "_plain_cache", out)
            return dict(out)
        return out
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _build(cls: type[_R], data: dict[str, Any]) -> _R:
    return cls(**{name: data[name] for name in field_names(cls) if name in data})


def _sensors(data: dict[str, Any] | None) -> GpuSensors | None:
    if not isinstance(data, dict):
        return None
    throttle = data.get("throttle")
    return _build(GpuSensors, {**data, "throttle": tuple(throttle) if isinstance(throttle, (list, tuple)) else None})


def engine_ledger(e: EngineInfo) -> dict[str, Any]:
    """An engine's KFD ledger as status --json and engines list --json carry it ("ledger")."""
    return {"registered_bytes": e.registered_bytes, "pinned_bytes": e.pinned_bytes,
            "pinned_peak_bytes": e.pinned_peak_bytes, "failed_calls": e.failed_call_count,
            "last_failed_calls": [_plain(c) for c in e.failed_calls]}


def host_ledger_from(raw: Any) -> HostLedger | None:
    """A HostLedger from a state file's (or a document's) "host_ledger"; None when there is none. The failures of a
    state file are the shim's words of what the engine's interposer sent: anything malformed is left out."""
    if not isinstance(raw, dict):
        return None

    def count(v: Any) -> int:
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else 0

    def opt(v: Any, kind: type) -> Any:
        if kind is str:
            return v if isinstance(v, str) else None
        return kind(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    failures = tuple(HostCall(kind=opt(f.get("kind"), str) or "alloc", call=opt(f.get("call"), str),
                              bytes=opt(f.get("bytes"), int), result=opt(f.get("result"), int),
                              ts=opt(f.get("ts"), float), seconds=opt(f.get("seconds"), float),
                              flags=opt(f.get("flags"), int), pid=opt(f.get("pid"), int), via=opt(f.get("via"), str))
                     for f in raw.get("failures") or () if isinstance(f, dict))
    procs = raw.get("processes")
    return HostLedger(pinned_bytes=count(raw.get("pinned_bytes")), peak_bytes=count(raw.get("peak_bytes")),
                      pinned_count=count(raw.get("pinned_count")), allocs=count(raw.get("allocs")),
                      frees=count(raw.get("frees")), failed=count(raw.get("failed")),
                      processes=len(procs) if isinstance(procs, dict) else count(procs),
                      untracked=count(raw.get("untracked")), unknown_frees=count(raw.get("unknown_frees")),
                      failures=failures, updated_at=opt(raw.get("updated_at"), float))


def snapshot_from_dict(data: dict[str, Any]) -> NodeSnapshot:
    """Inverse of NodeSnapshot.to_dict (used by bundle replay and tests)."""

    def int_keys(d: dict[str, Any] | None) -> dict[int, Any]:
        return {int(k): v for k, v in (d or {}).items()}

    gpus = tuple(_build(GpuInfo, {**g, "device_files": tuple(g.get("device_files", ())),
                                  "stale": _build(StaleRead, g["stale"]) if g.get("stale") else None,
                                  "sensors": _sensors(g.get("sensors"))})
                 for g in data.get("gpus", []))
    procs = tuple(
        _build(GpuProcess, {**p, "vram": int_keys(p.get("vram")), "sources": int_keys(p.get("sources")),
                            "device_files": tuple(p.get("device_files", ()))})
        for p in data.get("processes", [])
    )
    residual = tuple(
        _build(Residual, {**r, "holders": tuple(_build(Holder, {**h, "gpus": tuple(h.get("gpus", ()))})
                                                for h in r.get("holders", []))})
        for r in data.get("residual", [])
    )
    engines = tuple(
        _build(EngineInfo, {**e, "registrations": tuple(_build(Registration, r) for r in e.get("registrations", [])),
                            "host_ledger": host_ledger_from(e.get("host_ledger"))})
        for e in data.get("engines", [])
    )
    arenas = tuple(
        _build(ArenaInfo, {**a, "mappers": tuple(_build(ArenaMapper, m) for m in a.get("mappers", []))})
        for a in data.get("arenas", [])
    )
    pods = tuple(_build(PodGpus, {**p, "gpus": tuple(p.get("gpus", ()))}) for p in data.get("pods", []))
    driver = data.get("driver") if isinstance(data.get("driver"), dict) else _driver_from_gpus(data.get("gpus", []))
    checked = next((g.get("processes_vram_checked_at") for g in data.get("gpus", []) if isinstance(g, dict)), None)
    return _build(NodeSnapshot, {
        **data, "process_vram_checked_at": checked, "driver": driver, "process_load": _loads(data.get("processes", [])),
        "gpus": gpus, "processes": procs, "residual": residual, "engines": engines,
        "arenas": arenas, "pods": pods, "drained": tuple(data.get("drained", ())),
        "warnings": tuple(as_warning(w) for w in data.get("warnings", ()) or ()),
    })
