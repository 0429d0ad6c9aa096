"""amdgpu module parameters that decide recovery and memory: gpu_recovery, lockup_timeout, no_system_mem_limit, GTT.

Meanings from Linux drivers/gpu/drm/amd/amdgpu: amdgpu_drv.c (parameter docs), amdgpu_device.c
amdgpu_device_should_recover_gpu() (-1 = auto: recovery on, except a few old APUs/SI/CIK parts), the lockup_timeout
format "[GFX,Compute,SDMA,Video]" (0 keeps the default, negative = never time out), amdgpu_amdkfd_gpuvm.c (the KFD
system-memory limit, see ops/arena/budget.py), drivers/gpu/drm/ttm (ttm.pages_limit caps GTT-backed memory).
"""

from __future__ import annotations

from gpuwarden.ops.arena.budget import kfd_system_limit
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.arena import budget
from gpuwarden.ops.doctor.model import Result, passed, skip, unknown, warn
from gpuwarden.ops.doctor.node import amd_gpus, mem_total, node_config
from gpuwarden.ops.doctor.probe import CheckIO

PARAMS = "module/amdgpu/parameters"
MODPROBE = "/etc/modprobe.d/amdgpu.conf"
ENGINES = ("GFX", "Compute", "SDMA", "Video")


def _no_amdgpu(io: CheckIO) -> Result | None:
    if not io.exists("gpu", "module/amdgpu"):
        return skip("amdgpu is not loaded")
    return None


def _param(io: CheckIO, name: str) -> str | Result:
    """The parameter's value, or the verdict when amdgpu is absent or the file unreadable."""
    if (absent := _no_amdgpu(io)):
        return absent
    raw = io.line("gpu", f"{PARAMS}/{name}")
    if raw is None:
        return unknown(f"cannot read /sys/{PARAMS}/{name} (a driver older than the parameter?)")
    return raw


def check_gpu_recovery(io: CheckIO) -> Result:
    raw = _param(io, "gpu_recovery")
    if isinstance(raw, Result):
        return raw
    try:
        value = int(raw)
    except ValueError:
        return unknown(f"gpu_recovery reads {raw!r}, not a number")
    fix = (f"echo 'options amdgpu gpu_recovery=1' >> {MODPROBE}  (or amdgpu.gpu_recovery=1 on the kernel command "
           "line; reboot)")
    if value == 0:
        return warn("gpu_recovery=0: a hung GPU job is never recovered; the GPU stays wedged (\"GPU recovery "
                    "disabled.\" in dmesg) until the node reboots, taking every engine on it down", fix, value=value)
    if value == -1:
        return passed("gpu_recovery=-1 (auto): the driver resets a hung GPU on current hardware (auto disables it only "
                      "on a few old APUs and SI/CIK parts); engines on that GPU lose their contexts", value=value)
    return passed(f"gpu_recovery={value}: the driver resets a hung GPU; engines on it lose their contexts", value=value)


def parse_lockup_timeout(raw: str) -> dict[str, int | None]:
    """{engine: ms or None for the default}; one value applies to every non-compute engine."""
    values = [v.strip() for v in raw.split(",")] if raw.strip() else []
    out: dict[str, int | None] = {e: None for e in ENGINES}
    if len(values) == 1:
        ms = int(values[0])
        for e in ("GFX", "SDMA", "Video"):
            out[e] = ms or None
        return out
    for engine, v in zip(ENGINES, values):
        out[engine] = int(v) or None
    return out


def check_lockup_timeout(io: CheckIO) -> Result:
    raw = _param(io, "lockup_timeout")
    if isinstance(raw, Result):
        return raw
    try:
        per = parse_lockup_timeout(raw)
    except ValueError:
        return unknown(f"lockup_timeout reads {raw!r}, not [GFX,Compute,SDMA,Video] milliseconds")
    never = [e for e, ms in per.items() if ms is not None and ms < 0]
    shown = ", ".join(f"{e} {'default' if ms is None else ('never' if ms < 0 else f'{ms} ms')}" for e, ms in per.items())
    if never:
        return warn(f"lockup_timeout={raw}: jobs on {', '.join(never)} never time out, so a hang there is never "
                    f"detected and never recovered ({shown})",
                    f"remove lockup_timeout from {MODPROBE} / the kernel command line (default 10000 ms)",
                    value=raw, engines=per)
    return passed(f"lockup_timeout={raw or '(default)'}: a kernel-queue job running longer than this is a hang and "
                  f"starts recovery ({shown}); ROCm compute runs on KFD user queues, which this does not time",
                  value=raw, engines=per)


def _plan_budget(io: CheckIO) -> budget.Budget | None:
    """The node config's arena plan against KFD's limit (ops/arena/budget), or None without a plan."""
    cfg = node_config(io)
    if cfg is None or cfg.arena is None or not cfg.engines:
        return None
    settings = io.settings.with_(sysfs_root=io.roots.gpu, proc_root=io.roots.proc)
    try:
        size, visible = budget.from_config(settings)
        return budget.compute(settings, size, visible, [e.name for e in cfg.engines])
    except GpuwardenError:
        return None


def check_kfd_limit(io: CheckIO) -> Result:
    raw = _param(io, "no_system_mem_limit")
    if isinstance(raw, Result):
        return raw
    total = mem_total(io)
    limit = kfd_system_limit(total) if total else None
    shown = fmt_bytes(limit) if limit else "RAM - RAM/64 - 1.5 GiB"
    off = raw in ("Y", "y", "1")
    plan = _plan_budget(io)
    if off:
        needed = "" if plan is None else (
            "; the arena plan would not fit without it" if plan.charged + (plan.kfd_used or 0) > plan.limit
            else "; the arena plan fits even without it")
        return passed("no_system_mem_limit=Y: KFD does not count host-memory registrations against a node-wide limit; "
                      f"pinned pages are still real RAM{needed}", value=raw, limit=None)
    if plan is not None and not plan.fits:
        source = "KFD's own limit (debugfs kfd/mem_limit)" if plan.limit_source == "debugfs" else \
            "the limit computed from RAM"
        return warn(f"no_system_mem_limit=N, and the arena plan charges {fmt_bytes(plan.charged)} against "
                    f"{source} of {fmt_bytes(plan.limit)}: " + (plan.crossing or "registrations past it fail"),
                    "echo 1 > /sys/module/amdgpu/parameters/no_system_mem_limit (takes effect at once; keep it with "
                    "`options amdgpu no_system_mem_limit=1` in /etc/modprobe.d/amdgpu.conf), or one GPU per engine "
                    "(ROCR_VISIBLE_DEVICES)", value=raw, limit=plan.limit, charged=plan.charged,
                    limit_source=plan.limit_source)
    return passed(f"no_system_mem_limit=N: every hipHostRegister (userptr) registration, once per GPU the process "
                  f"sees, counts against one node-wide limit of {shown}; kfd-budget checks the arena against it",
                  value=raw, limit=limit)


def check_gtt(io: CheckIO) -> Result:
    if (absent := _no_amdgpu(io)):
        return absent
    gttsize = io.line("gpu", f"{PARAMS}/gttsize")
    pages = io.int("gpu", "module/ttm/parameters/pages_limit")
    totals = {}
    for gpu in amd_gpus(io):
        if gpu.dev:
            v = io.int("gpu", f"{gpu.dev}/mem_info_gtt_total")
            if v is not None:
                totals[gpu.index] = v
    if not totals and pages is None and gttsize is None:
        return unknown("no GTT figures readable (mem_info_gtt_total, ttm pages_limit, amdgpu gttsize)")
    per_gpu = ", ".join(f"GPU {i} {fmt_bytes(v)}" for i, v in totals.items())
    ttm = f"ttm.pages_limit={pages} ({fmt_bytes(pages * 4096)} with 4 KiB pages)" if pages else "ttm.pages_limit unread"
    size = "" if gttsize in (None, "-1") else f"; amdgpu.gttsize={gttsize} MiB overrides TTM's figure for amdgpu"
    return passed(f"GTT {per_gpu or 'per GPU unread'}; {ttm}{size}. GTT is host memory the driver maps for GPU "
                  "buffers it allocates (hipHostMalloc, GTT BOs); ttm.pages_limit caps them all together. The arena's "
                  "registration is userptr memory, counted by KFD's system limit instead (kfd-budget)",
                  gtt_total=totals, ttm_pages_limit=pages, gttsize_mib=gttsize)
