"""The metric families of one Reading: every gpuwarden_* series, rebuilt from scratch at each scrape so a GPU,
engine or process that went away leaves no stale series. Base units (bytes, seconds, ratios), counters _total.

docs/metrics.md documents each family; tests/integration/ops/metrics/test_metrics_rules.py holds the table to them.
"""

from __future__ import annotations

import heapq
import os
import platform
from typing import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from gpuwarden.ops import __version__
from gpuwarden.ops.foundation.model import FAILED_REGISTRATION, EngineInfo, GpuInfo, Holder, NodeSnapshot, Registration, Residual
from gpuwarden.ops.foundation.status_protocol import PHASES
from gpuwarden.ops.metrics.reading import MetricsOptions, Reading
from gpuwarden.ops.metrics.kubefamilies import kubernetes_families

P = "gpuwarden_"
GPU_LABELS = ("gpu", "bus_id", "uuid", "model")
ENGINE_LABELS = ("engine", "gpu")
# Holder kinds, each always exported per GPU (0 when none) so alerts and rate() see every change.
HOLDER_KINDS = ("zombie", "disk-sleep", "dead-pid", "unknown-pid", "device-file")
_KIND_OF_REASON = {"zombie": "zombie", "disk-sleep": "disk-sleep", "kfd-without-process": "dead-pid",
                   "dead": "dead-pid", "unknown-pid": "unknown-pid"}
ENGINE_PHASES = ("waiting", *PHASES, FAILED_REGISTRATION, "crashed", "stale")
NOT_UP = ("exited", "crashed", "stale")
# Crash signals exported at 0 for every engine before any crash, so increase() counts the first one (a series
# that is born at 1 shows no increase): the arena storm is a burst of first SIGSEGVs.
CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE", "SIGKILL")
REGISTRATION_OUTCOMES = ("registered", "failed", "hung", "running", "died")


def _gauge(name: str, doc: str, labels: tuple[str, ...], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=list(labels), unit=unit)


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> CounterMetricFamily:
    return CounterMetricFamily(P + name, doc, labels=list(labels))


def _add_known(labels: tuple[str, ...], readings: Iterable[tuple[GaugeMetricFamily, float | None]],
               unit: Callable[[float], float] | None = None) -> None:
    """One sample per reading the source gave, in the family's base unit; none (no series, never a made-up 0)
    for a reading it did not give."""
    for fam, value in readings:
        if value is not None:
            fam.add_metric(labels, value if unit is None else unit(value))


def _ratio(percent: float) -> float:
    return percent / 100.0


def _hertz(mhz: float) -> float:
    return mhz * 1e6


def _per_second(gts: float) -> float:
    return gts * 1e9


class _Labels:
    """Label names and values for one kind of object, with the optional hostname label appended."""

    def __init__(self, names: tuple[str, ...], hostname: str | None):
        self.host = (hostname,) if hostname else ()
        self.names = names + (("hostname",) if hostname else ())

    def of(self, *values: str) -> tuple[str, ...]:
        return values + self.host


def families(reading: Reading, options: MetricsOptions) -> list[Metric]:
    """Every family for this reading, in the manual's order (docs/metrics.md)."""
    snap = reading.snapshot
    out: list[Metric] = []
    out.extend(_gpu_families(reading, options))
    out.extend(_engine_families(snap, reading.now, options))
    out.extend(_arena_families(reading, options))
    if snap.driver:
        out.extend(_driver_families(snap, options))
    if reading.findings is not None:
        out.append(_findings(reading, options))
    if options.per_process:
        out.extend(_process_families(snap, options))
    if snap.kubernetes is not None or snap.pods or any(h.pod for r in snap.residual for h in r.holders):
        out.extend(kubernetes_families(snap, {g.index: _gpu_label_values(g) for g in snap.gpus}, GPU_LABELS, options))
    out.extend(_agent_families(reading, options))
    return [f for f in out if f.samples]  # a family with nothing to say (no engines yet) is left out


# --- GPUs ------------------------------------------------------------------------------------------------------
def _gpu_label_values(g: GpuInfo) -> tuple[str, ...]:
    return (str(g.index), g.bus_id or "", g.uuid or "", g.name or "")


def _holder_kind(holder: Holder) -> str:
    if not holder.vram_bytes:
        return "device-file"  # keeps a GPU device file open, no VRAM charged to it
    return _KIND_OF_REASON.get(holder.reason, "dead-pid")


def _gpu_families(reading: Reading, options: MetricsOptions) -> Iterator[Metric]:
    snap = reading.snapshot
    lab = _Labels(GPU_LABELS, options.hostname)
    kind_lab = _Labels(GPU_LABELS + ("kind",), options.hostname)
    residual = {r.gpu_index: r for r in snap.residual}
    drained = set(snap.drained)
    users: dict[int, int] = {}
    for p in snap.processes:
        for gi in p.vram:
            users[gi] = users.get(gi, 0) + 1

    vram_used = _gauge("gpu_vram_used_bytes", "VRAM in use on the GPU, as the device reports it.", lab.names)
    vram_total = _gauge("gpu_vram_total_bytes", "VRAM of the GPU.", lab.names)
    gtt_used = _gauge("gpu_gtt_used_bytes", "GTT (host memory mapped for the GPU) in use.", lab.names)
    gtt_total = _gauge("gpu_gtt_total_bytes", "GTT size.", lab.names)
    accounted = _gauge("gpu_vram_accounted_bytes", "VRAM that live processes account for.", lab.names)
    res = _gauge("gpu_residual_bytes", "Residual VRAM: device used - live processes' VRAM - idle baseline "
                 "(absent when unknown).", lab.names)
    significant = _gauge("gpu_residual_significant", "1 when the residual is above the tolerance "
                         "(max(512 MiB, 1%) without a baseline) and needs the operator.", lab.names)
    holders = _gauge("gpu_residual_holders", "Processes or driver entries that keep VRAM or a GPU device file "
                     "after their owner should have let go, by kind.", kind_lab.names)
    baseline = _gauge("gpu_baseline_bytes", "Idle VRAM use recorded by `gpuwarden baseline record`.", lab.names)
    drained_f = _gauge("gpu_drained", "1 when the GPU is drained (no new engines).", lab.names)
    reset = _gauge("gpu_needs_reset", "1 when residual VRAM is held by nothing gpuwarden can remove: only a GPU "
                   "reset clears it.", lab.names)
    busy = _gauge("gpu_busy_ratio", "GPU busy fraction (0-1).", lab.names)
    temp = _gauge("gpu_temperature_celsius", "GPU temperature.", lab.names)
    power = _gauge("gpu_power_watts", "GPU power draw.", lab.names)
    procs = _gauge("gpu_processes", "Processes with VRAM on the GPU.", lab.names)
    stale = _gauge("gpu_stale", "1 when a read of the GPU (a sysfs file, an amdsmi or NVML call) did not answer "
                   "within the read deadline: the GPU may be hung, and the readings it did not give are absent.",
                   lab.names)
    fams: list[Metric] = [vram_used, vram_total, gtt_used, gtt_total, accounted, res, significant, holders]
    age = None
    since_by_gpu = reading.residual_since
    if since_by_gpu is not None:
        age = _gauge("gpu_residual_age_seconds", "Seconds since the GPU's residual became significant "
                     "(0 when it is not).", lab.names)
        fams.append(age)
    fams += [baseline, drained_f, reset, busy, temp, power, procs, stale]

    for g in snap.gpus:
        ident = _gpu_label_values(g)
        values = lab.of(*ident)
        _add_known(values, ((vram_used, g.vram_used), (vram_total, g.vram_total), (gtt_used, g.gtt_used),
                            (gtt_total, g.gtt_total), (temp, g.temperature_c), (power, g.power_w)))
        _add_known(values, ((busy, g.busy_percent),), _ratio)
        r: Residual | None = residual.get(g.index)
        counts = dict.fromkeys(HOLDER_KINDS, 0)
        if r is not None:
            accounted.add_metric(values, r.accounted)
            if r.residual is not None:
                res.add_metric(values, r.residual)
            if r.baseline is not None:
                baseline.add_metric(values, r.baseline)
            for h in r.holders:
                counts[_holder_kind(h)] += 1
        is_significant = r is not None and r.significant
        significant.add_metric(values, 1 if is_significant else 0)
        for kind in HOLDER_KINDS:
            holders.add_metric(kind_lab.of(*ident, kind), counts[kind])
        if age is not None and since_by_gpu is not None:
            since = since_by_gpu.get(g.index) if is_significant else None
            age.add_metric(values, max(0.0, reading.now - since) if since is not None else 0.0)
        drained_f.add_metric(values, 1 if g.index in drained else 0)
        reset.add_metric(values, 1 if r is not None and r.significant and not r.holders else 0)
        procs.add_metric(values, users.get(g.index, 0))
        stale.add_metric(values, 1 if g.stale is not None else 0)
    fams += list(_sensor_families(snap, lab, options))
    return iter(fams)


def _sensor_families(snap: NodeSnapshot, lab: "_Labels", options: MetricsOptions) -> Iterator[Metric]:
    """The GPUs' sensors (GpuSensors): a series only where the source has the reading."""
    clock_lab = _Labels(GPU_LABELS + ("clock",), options.hostname)
    link_lab = _Labels(GPU_LABELS + ("link",), options.hostname)
    sensor_lab = _Labels(GPU_LABELS + ("sensor",), options.hostname)
    ras_lab = _Labels(GPU_LABELS + ("block", "type"), options.hostname)
    reason_lab = _Labels(GPU_LABELS + ("reason",), options.hostname)
    clock = _gauge("gpu_clock_hertz", "Current clock (sclk: shader/SM, mclk: memory).", clock_lab.names)
    clock_max = _gauge("gpu_clock_max_hertz", "Highest clock of its DPM table / NVML's maximum.", clock_lab.names)
    fan_rpm = _gauge("gpu_fan_rpm", "Fan speed in revolutions per minute.", lab.names)
    fan = _gauge("gpu_fan_ratio", "Fan speed as a fraction of its maximum (0-1).", lab.names)
    cap = _gauge("gpu_power_cap_watts", "Power cap (limit) in force.", lab.names)
    mem_busy = _gauge("gpu_memory_busy_ratio", "Memory-controller activity (0-1).", lab.names)
    speed = _gauge("gpu_pcie_link_transfers_per_second", "PCIe link speed per lane (current, max).", link_lab.names)
    width = _gauge("gpu_pcie_link_width_lanes", "PCIe link width (current, max).", link_lab.names)
    temp = _gauge("gpu_sensor_temperature_celsius", "Temperature by sensor (edge, junction, memory, gpu).",
                  sensor_lab.names)
    ras = _counter("gpu_ras_errors", "RAS/ECC error counts by block and type (ce corrected, ue uncorrected, "
                   "de deferred), since the driver loaded.", ras_lab.names)
    retired = _gauge("gpu_retired_pages", "VRAM pages retired (AMD bad pages; NVIDIA remapped rows).", lab.names)
    pending = _gauge("gpu_pending_retired_pages", "Bad pages waiting to be retired at the next reset.", lab.names)
    threshold = _gauge("gpu_bad_page_threshold", "Retired pages at which the GPU is flagged for replacement "
                       "(only where the driver's threshold is set explicitly).", lab.names)
    throttled = _gauge("gpu_throttled", "1 for each reason holding the clocks down now (only reasons that are "
                       "active, and only where the source tells).", reason_lab.names)
    for g in snap.gpus:
        s = g.sensors
        if s is None:
            continue
        ident = _gpu_label_values(g)
        values = lab.of(*ident)
        for kind, now, top in (("sclk", s.sclk_mhz, s.sclk_max_mhz), ("mclk", s.mclk_mhz, s.mclk_max_mhz)):
            _add_known(clock_lab.of(*ident, kind), ((clock, now), (clock_max, top)), _hertz)
        _add_known(values, ((fan_rpm, s.fan_rpm), (cap, s.power_cap_w), (retired, s.retired_pages),
                            (pending, s.pending_pages), (threshold, s.bad_page_threshold)))
        _add_known(values, ((fan, s.fan_percent), (mem_busy, s.mem_busy_percent)), _ratio)
        for which, gts, lanes in (("current", s.link_speed_gts, s.link_width),
                                  ("max", s.link_max_speed_gts, s.link_max_width)):
            _add_known(link_lab.of(*ident, which), ((speed, gts),), _per_second)
            _add_known(link_lab.of(*ident, which), ((width, lanes),))
        for sensor, c in s.temperatures.items():
            temp.add_metric(sensor_lab.of(*ident, sensor), c)
        for block, counts in s.ras.items():
            for kind, n in counts.items():
                ras.add_metric(ras_lab.of(*ident, block, kind), n)
        for reason in s.throttle or ():
            throttled.add_metric(reason_lab.of(*ident, reason), 1)
    return iter((clock, clock_max, fan_rpm, fan, cap, mem_busy, speed, width, temp, ras, retired, pending, threshold,
                 throttled))


# --- engines ---------------------------------------------------------------------------------------------------
def _last_run(e: EngineInfo) -> list[Registration]:
    """The registration calls (not unregistrations) of the engine's current (or last) run: those of its newest pid."""
    return [r for r in e.last_run_registrations() if r.kind == "register"]


def _engine_families(snap: NodeSnapshot, now: float, options: MetricsOptions) -> Iterator[Metric]:
    lab = _Labels(ENGINE_LABELS, options.hostname)
    phase_lab = _Labels(ENGINE_LABELS + ("phase",), options.hostname)
    signal_lab = _Labels(ENGINE_LABELS + ("signal",), options.hostname)
    outcome_lab = _Labels(ENGINE_LABELS + ("outcome",), options.hostname)
    up = _gauge("engine_up", "1 while the engine's shim supervises a run that has not ended.", lab.names)
    phase = _gauge("engine_phase", "The engine's phase as a state set: 1 for the current phase, 0 for the others.",
                   phase_lab.names)
    in_phase = _gauge("engine_phase_seconds", "Seconds the engine has been in its current phase.", lab.names)
    restarts = _counter("engine_restarts", "Restarts of the engine by its shim (restart policy on-failure).",
                        lab.names)
    crashes = _counter("engine_crashes", "Runs of the engine that ended in a crash, by signal (\"none\": a "
                       "non-zero exit code).", signal_lab.names)
    reg_s = _gauge("engine_registration_seconds", "Seconds the last run's host registrations took (the calls "
                   "themselves, summed).", lab.names)
    reg_wait = _gauge("engine_registration_wait_seconds", "Seconds the last run's registrations waited for a "
                      "gate slot, summed.", lab.names)
    reg_bytes = _gauge("engine_registered_bytes", "Bytes the last run registered successfully.", lab.names)
    regs = _gauge("engine_registrations", "The last run's registration calls, by outcome.", outcome_lab.names)
    # The KFD ledger (interposer): pinned host memory draws on the same KFD system-memory limit as registrations.
    pinned = _gauge("engine_pinned_bytes", "Pinned host memory (hipHostMalloc, cudaHostAlloc, ...) the engine's "
                    "processes hold, at the interposer's last report.", lab.names)
    pinned_peak = _gauge("engine_pinned_peak_bytes", "The most pinned host memory the run held at once (per "
                         "process, summed).", lab.names)
    failed_calls = _counter("engine_failed_host_calls", "Host calls of the run that returned an error: "
                            "registrations and pinned allocations/frees (resets when the engine restarts).",
                            lab.names)
    for e in snap.engines:
        gpu = "" if e.gpu is None else str(e.gpu)
        values = lab.of(e.name, gpu)
        up.add_metric(values, 0 if e.phase in NOT_UP else 1)
        phases = ENGINE_PHASES if e.phase in ENGINE_PHASES else ENGINE_PHASES + (e.phase,)
        for p in phases:
            phase.add_metric(phase_lab.of(e.name, gpu, p), 1 if p == e.phase else 0)
        since = getattr(e, "phase_since", None)
        if since is not None:
            in_phase.add_metric(values, max(0.0, now - since))
        restarts.add_metric(values, e.restarts)
        counted = getattr(e, "crashes", None) or {}
        for sig in dict.fromkeys(CRASH_SIGNALS + tuple(sorted(counted))):
            crashes.add_metric(signal_lab.of(e.name, gpu, sig), counted.get(sig, 0))
        run = _last_run(e)
        if run:
            reg_s.add_metric(values, sum(r.seconds or 0.0 for r in run))
            reg_wait.add_metric(values, sum(r.wait_s or 0.0 for r in run))
            reg_bytes.add_metric(values, sum(r.bytes or 0 for r in run if r.outcome == "registered"))
            by_outcome = dict.fromkeys(REGISTRATION_OUTCOMES, 0)
            for r in run:
                by_outcome[r.outcome] = by_outcome.get(r.outcome, 0) + 1
            for outcome, n in by_outcome.items():
                regs.add_metric(outcome_lab.of(e.name, gpu, outcome), n)
        ledger = getattr(e, "host_ledger", None)
        if ledger is not None:
            pinned.add_metric(values, ledger.pinned_bytes)
            pinned_peak.add_metric(values, ledger.peak_bytes)
        if run or ledger is not None:
            failed_calls.add_metric(values, e.failed_call_count)
    return iter((up, phase, in_phase, restarts, crashes, reg_s, reg_wait, reg_bytes, regs, pinned, pinned_peak,
                 failed_calls))


# --- arena and the KFD registration budget ---------------------------------------------------------------------
def _arena_families(reading: Reading, options: MetricsOptions) -> Iterator[Metric]:
    lab = _Labels(("arena",), options.hostname)
    none = _Labels((), options.hostname)
    size = _gauge("arena_size_bytes", "Size of the shared weight arena file.", lab.names)
    ok = _gauge("arena_header_ok", "1 when the arena's header (magic, hash) verifies.", lab.names)
    mappers = _gauge("arena_mappers", "Processes that have the arena mapped.", lab.names)
    registered = _gauge("arena_registered", "Mappers that registered the arena with their GPU.", lab.names)
    for a in reading.snapshot.arenas:
        values = lab.of(a.path)
        if a.size is not None:
            size.add_metric(values, a.size)
        ok.add_metric(values, 1 if a.header_state == "ok" else 0)
        mappers.add_metric(values, len(a.mappers))
        registered.add_metric(values, sum(1 for m in a.mappers if m.registered))
    fams: list[Metric] = [size, ok, mappers, registered]
    plan = reading.plan
    if plan is not None:
        limit = _gauge("kfd_system_limit_bytes", "KFD's system-memory limit for host registrations and pinned host "
                       "allocations (absent with amdgpu.no_system_mem_limit=1).", none.names)
        charge = _gauge("arena_plan_charge_bytes", "What the node config's launch plan's registrations charge against "
                        "the KFD limit: arena size once per engine process, whatever GPUs it sees.", lab.names)
        fits = _gauge("arena_plan_fits", "1 when the launch plan's registrations plus each engine's pinned headroom "
                      "fit under the KFD limit.", lab.names)
        if not plan.no_limit:
            limit.add_metric(none.of(), plan.limit)
        charge.add_metric(lab.of(plan.arena), plan.charged)
        fits.add_metric(lab.of(plan.arena), 1 if plan.fits else 0)
        fams += [limit, charge, fits]
    return iter(fams)


# --- the driver's own books (debugfs) ---------------------------------------------------------------------------
def _driver_families(snap: NodeSnapshot, options: MetricsOptions) -> Iterator[Metric]:
    none = _Labels((), options.hostname)
    lab = _Labels(GPU_LABELS, options.hostname)
    used = _gauge("kfd_system_mem_used_bytes", "KFD system memory charged now by every process's registrations "
                  "(debugfs kfd/mem_limit, MiB resolution).", none.names)
    limit = _gauge("kfd_system_mem_limit_bytes", "KFD's node-wide system-memory limit as the driver reports it "
                   "(debugfs kfd/mem_limit).", none.names)
    computed = _gauge("kfd_system_mem_limit_computed_bytes", "KFD's system-memory limit computed from RAM (RAM - "
                      "RAM/64 - 1.5 GiB, as amdgpu does at load), when debugfs kfd/mem_limit cannot be read.",
                      none.names)
    free = _gauge("vram_allocator_free_bytes", "Free VRAM in the driver's VRAM allocator (debugfs amdgpu_vram_mm).",
                  lab.names)
    largest = _gauge("vram_largest_free_block_bytes", "The largest free VRAM block: the biggest one allocation can "
                     "get (debugfs amdgpu_vram_mm).", lab.names)
    frag = _gauge("vram_fragmentation_ratio", "1 - largest free block / the largest block the free VRAM could form "
                  "(all of it for drm_mm, its highest power of two for drm_buddy): 0 unfragmented (an idle GPU), "
                  "near 1 in crumbs.", lab.names)
    d = snap.driver or {}
    k = d.get("kfd_mem_limit")
    if k:
        used.add_metric(none.of(), k["system_used"])
        limit.add_metric(none.of(), k["system_limit"])
    elif d.get("kfd_mem_limit_computed"):
        computed.add_metric(none.of(), d["kfd_mem_limit_computed"]["system_limit"])
    labels = {g.index: _gpu_label_values(g) for g in snap.gpus}
    for v in d.get("vram_free") or ():
        values = lab.of(*labels.get(v["gpu"], (str(v["gpu"]), "", "", "")))
        free.add_metric(values, v["free"])
        largest.add_metric(values, v["largest_free_block"])
        if v.get("fragmentation") is not None:
            frag.add_metric(values, v["fragmentation"])
    return iter((used, limit, computed, free, largest, frag))


# --- kernel log ------------------------------------------------------------------------------------------------
def _findings(reading: Reading, options: MetricsOptions) -> Metric:
    lab = _Labels(("category", "severity"), options.hostname)
    fam = _counter("kernel_findings", "Kernel-log occurrences the agent's watch classified (GPU page faults, ring "
                   "timeouts, resets, Xids, segfaults, ...), by category and severity.", lab.names)
    for (category, severity), n in sorted(reading.findings.items()):  # type: ignore[union-attr]
        fam.add_metric(lab.of(category, severity), n)
    return fam


# --- processes (opt-in) ----------------------------------------------------------------------------------------
def _program(command: str) -> str:
    """The program's name only: a command line can carry secrets and is unbounded."""
    first = command.split(" ", 1)[0] if command else ""
    return os.path.basename(first)[:40]


def _process_families(snap: NodeSnapshot, options: MetricsOptions) -> Iterator[Metric]:
    names = ("gpu", "pid", "user", "command", "container", "namespace", "pod")
    lab = _Labels(names, options.hostname)
    gpu_lab = _Labels(("gpu",), options.hostname)
    fam = _gauge("process_vram_bytes", f"VRAM per process and GPU (--per-process): the largest "
                 f"{options.per_process_max} pairs.", lab.names)
    rest = _gauge("process_vram_unlisted_bytes", "VRAM of the processes left out of process_vram_bytes by its cap.",
                  gpu_lab.names)
    # GPU% of the same (process, GPU) pairs, so its cardinality has the same cap (and the series join on labels).
    busy = _gauge("process_gpu_busy_percent", "GPU time per process and GPU over the agent's interval (AMD: DRM fdinfo "
                  "gfx+compute, NVIDIA: NVML SM utilisation, at most 5 s old where that call is dear), for the pairs "
                  "process_vram_bytes lists (--per-process).",
                  lab.names)
    pairs = [(b, -gi, -p.pid, p) for p in snap.processes for gi, b in p.vram.items() if b > 0]
    keep = heapq.nlargest(options.per_process_max, pairs, key=lambda t: t[:3])
    loads = snap.process_load
    for b, gi, _, p in keep:
        gi = -gi
        values = lab.of(str(gi), str(p.pid), p.user or "", _program(p.command),
                        p.container_name or p.container or "", p.namespace or "", p.pod or "")
        fam.add_metric(values, b)
        load = loads.get(p.pid)
        gpu_load = load.gpus.get(gi) if load is not None else None
        if gpu_load is not None and gpu_load.percent is not None:
            busy.add_metric(values, gpu_load.percent)
    left: dict[int, int] = {}
    for b, gi, _, _ in pairs:
        left[-gi] = left.get(-gi, 0) + b
    for b, gi, _, _ in keep:
        left[-gi] -= b
    for g in snap.gpus:
        rest.add_metric(gpu_lab.of(str(g.index)), left.get(g.index, 0))
    return iter((fam, rest, busy))


# --- the agent -------------------------------------------------------------------------------------------------
def _agent_families(reading: Reading, options: MetricsOptions) -> Iterator[Metric]:
    snap = reading.snapshot
    none = _Labels((), options.hostname)
    out: list[Metric] = []
    if snap.duration_s is not None:
        duration = GaugeMetricFamily(P + "agent_sample_duration_seconds", "How long the latest snapshot took.",
                                     labels=list(none.names))
        duration.add_metric(none.of(), snap.duration_s)
        out.append(duration)
    stale = _gauge("agent_stale", "1 when the agent has no fresh snapshot (a backend call hangs or sampling "
                   "stopped): every other series is as old as agent_snapshot_age_seconds.", none.names)
    stale.add_metric(none.of(), 1 if reading.stale else 0)
    out.append(stale)
    if reading.age_s is not None:
        age = _gauge("agent_snapshot_age_seconds", "Age of the snapshot these series come from.", none.names)
        age.add_metric(none.of(), reading.age_s)
        out.append(age)
    info = InfoMetricFamily(P + "agent", "Where these series come from: backend, simulated node or not, and "
                            "whether the node agent served them.", labels=list(none.names))
    info.add_metric(none.of(), {"backend": snap.backend, "simulated": "true" if snap.simulated else "false",
                                "mode": reading.mode})
    out.append(info)
    build = InfoMetricFamily(P + "build", "gpuwarden's version and Python.", labels=list(none.names))
    build.add_metric(none.of(), {"version": __version__, "python": platform.python_version()})
    out.append(build)
    return iter(out)
