"""Plain-text rendering of a NodeSnapshot for `gpuwarden status` (a compact table an SRE can read).

The TUI has its own widgets; this is for terminals, logs and pasting into an incident channel.
"""

from __future__ import annotations

import time

from gpuwarden.ops.foundation.model import ATTENTION_PHASES, FAILED_REGISTRATION, EngineInfo, NodeSnapshot, physical_devices
from gpuwarden.ops.foundation.safetext import bracketed
from gpuwarden.ops.foundation.units import fmt_bytes


def _pct(used: int | None, total: int | None) -> str:
    if used is None or not total:
        return "   -"
    return f"{100 * used / total:3.0f}%"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _unit(v: float | None, fmt: str, unit: str) -> str:
    return "-" if v is None else format(v, fmt) + unit


def short_command(command: str) -> str:
    """Drop directories from the program (and from the script an interpreter runs): the name is what
    an operator scans for in a narrow column; `status --json` keeps the whole command line."""
    parts = command.split(" ")
    if not parts or not parts[0].startswith("/"):
        return command
    parts[0] = parts[0].rsplit("/", 1)[-1]
    if parts[0].startswith(("python", "perl", "ruby", "node", "bash", "sh")) and len(parts) > 1 \
            and parts[1].startswith("/"):
        parts[1] = parts[1].rsplit("/", 1)[-1]
    return " ".join(parts)


def pod_ref(namespace: str | None, pod: str, container: str | None) -> str:
    """ns/pod (container c): how a Kubernetes operator names a pod."""
    return f"{namespace}/{pod}" + (f" (container {container})" if container else "")


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def kubernetes_line(k8s: dict) -> str:
    """What the agent last told the API server about this node, in one line."""
    cond = k8s.get("condition") or {}
    said = f"condition GPUResidualVRAM={cond['status']} ({cond.get('reason')})" if cond.get("status") \
        else "condition not written yet"
    taint = f"tainted gpuwarden.io/gpu-unhealthy={k8s['taint']}:NoSchedule" if k8s.get("taint") else "not tainted"
    if k8s.get("foreign_taint"):
        taint += " (a gpuwarden.io/gpu-unhealthy taint gpuwarden did not set is left alone)"
    return f"kubernetes: node {k8s.get('node')} (policy {k8s.get('policy')}): {said}, {taint}"


def spans(indexes: list[int]) -> str:
    """0-7, 9, 12-13: GPU indexes as an operator writes them."""
    out: list[list[int]] = []
    for i in sorted(indexes):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def _device_row(snap: NodeSnapshot, bus: str, members: list[int], res_by_gpu: dict) -> str:
    """The physical device's row above its partitions: its modes, how many partitions hold a residual, its reset.
    No VRAM sum: partitions of an NPS1 device each report the one shared pool, so adding them up would lie."""
    first = snap.gpu(members[0])
    mode = "/".join(m for m in ((first.compute_partition, first.memory_partition) if first else ()) if m)
    leaky = sum(1 for i in members if (r := res_by_gpu.get(i)) is not None and r.significant)
    residual = f"on {leaky} of {len(members)}" if leaky else "-"
    label = f"{bus} {mode}".strip()
    return (f"{'dev':>3}  {label[:24]:<24} {f'{len(members)} partitions':>23} {'':>4}  {residual:>10}  "
            f"{'':>4} {'':>5} {'':>6}  reset: all {len(members)}")


def driver_lines(d: dict) -> list[str]:
    """The driver's own books (debugfs): KFD system memory against its limit, VRAM fragmentation per GPU."""
    k = d.get("kfd_mem_limit")
    out = [f"KFD system memory {fmt_bytes(k['system_used'])} of {fmt_bytes(k['system_limit'])} "
           f"({100 * k['system_used'] / max(k['system_limit'], 1):.0f}%, debugfs kfd/mem_limit)" if k else
           f"KFD system memory: not read ({d.get('kfd_mem_limit_unavailable')}); `gpuwarden arena budget` computes "
           "the limit from RAM"]
    frees = d.get("vram_free") or []
    if frees:
        out.append("VRAM free (largest block, fragmentation): " + "; ".join(
            f"GPU {v['gpu']} {fmt_bytes(v['free'])} ({fmt_bytes(v['largest_free_block'])}, "
            f"{v['fragmentation'] if v['fragmentation'] is not None else '-'})" for v in frees))
    return out


def render(snap: NodeSnapshot, width: int = 100) -> str:
    lines: list[str] = []
    label = "  ** SIMULATED **" if snap.simulated else ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.taken_at))
    src = "" if snap.source == "live" else f"  (replay of {snap.source[7:] if snap.source.startswith('bundle:') else snap.source})"
    via = ""
    if snap.agent:
        via = "  via agent"
        if snap.agent.get("stale"):
            via += f" (STALE: {snap.agent.get('age_s', 0):.0f}s old, sampling hangs)"
    lines.append(f"{snap.hostname}  backend={snap.backend}{label}  {when}{src}{via}")
    lines.append("")
    lines.append(f"{'GPU':>3}  {'NAME':<24} {'VRAM USED / TOTAL':>23} {'':>4}  {'RESIDUAL':>10}  "
                 f"{'BUSY':>4} {'TEMP':>5} {'POWER':>6}  NOTE")
    res_by_gpu = {r.gpu_index: r for r in snap.residual}
    devices = physical_devices(snap.gpus)
    member_of = {i: bus for bus, members in devices.items() for i in members}
    for g in snap.gpus:
        bus = member_of.get(g.index)
        if bus is not None and devices[bus][0] == g.index:
            lines.append(_device_row(snap, bus, devices[bus], res_by_gpu))
        r = res_by_gpu.get(g.index)
        residual = "-" if r is None or r.residual is None else fmt_bytes(max(r.residual, 0))
        notes = []
        if g.stale is not None:
            notes.append(f"STALE ({g.stale.what}: no answer for {ago(snap.taken_at - g.stale.since)})")
        if g.index in snap.drained:
            notes.append("DRAINED")
        if r and r.significant:
            notes.append("RESIDUAL!")
        if r and r.holders:
            notes.append(f"{len(r.holders)} holder(s)")
        mem = f"{fmt_bytes(g.vram_used)} / {fmt_bytes(g.vram_total)}"
        # A partition's row: its place on the physical device (the device's row above it names the device).
        name = f"└ {g.compute_partition or 'partition'} {devices[bus].index(g.index)}" if bus is not None else g.name
        lines.append(
            f"{g.index:>3}  {name[:24]:<24} {mem:>23} {_pct(g.vram_used, g.vram_total)}  {residual:>10}  "
            f"{_unit(g.busy_percent, '3.0f', '%'):>4} {_unit(g.temperature_c, '4.0f', 'C'):>5} "
            f"{_unit(g.power_w, '5.0f', 'W'):>6}  "
            f"{' '.join(notes)}")
    for bus, members in devices.items():
        first = snap.gpu(members[0])
        mode = first.compute_partition if first is not None and first.compute_partition else "logical GPU"
        memory = f", memory {first.memory_partition}" if first is not None and first.memory_partition else ""
        lines.append(f"device {bus}: GPUs {spans(members)} are its {len(members)} {mode} partitions{memory}; VRAM and "
                     f"residual are per partition; a reset acts on the physical device: all {len(members)} together")
    lines.append("")
    if snap.processes:
        # GPU% where there is room and a source gives it (fdinfo, NVML): "-" until a second sample makes an interval.
        loads = snap.process_load
        gpu_col = width >= 100 and any(load.source for load in loads.values())
        lines.append(f"{'PID':>8}  {'USER':<10} {'STATE':<11} {'GPU VRAM':<28} " + ("GPU%  " if gpu_col else "")
                     + "COMMAND")
        for p in snap.processes:
            per_gpu = ", ".join(f"{gi}:{fmt_bytes(b)}" for gi, b in sorted(p.vram.items())) or "(device files only)"
            cmd = short_command(p.command) if p.command else "(gone)"
            room = max(20, width - 63 - (6 if gpu_col else 0))
            busy = ""
            if gpu_col:
                load = loads.get(p.pid)
                pct = load.gpu_percent if load is not None else None
                busy = f"{'-' if pct is None else f'{pct:.0f}%':>4}  "
            lines.append(f"{p.pid:>8}  {(p.user or '?')[:10]:<10} {p.state:<11} {per_gpu[:28]:<28} {busy}{cmd[:room]}")
            if p.pod:
                lines.append(f"{'':>8}  pod {pod_ref(p.namespace, p.pod, p.container_name)}")
    else:
        lines.append("no GPU processes")
    holders = [(r.gpu_index, h) for r in snap.residual for h in r.holders]
    if holders:
        lines.append("")
        lines.append("RESIDUAL VRAM HOLDERS")
        seen = set()
        for _gi, h in holders:
            key = (h.pid, h.reason)
            if key in seen:
                continue
            seen.add(key)
            gpus = ",".join(str(x) for x in h.gpus) or "?"
            lines.append(f"  pid {h.pid if h.pid is not None else '-'} on GPU {gpus}: {h.reason} — "
                         f"{fmt_bytes(h.vram_bytes) if h.vram_bytes is not None else 'size unknown'}; {h.detail}"
                         + (f"  {bracketed(h.command[:40])}" if h.command else ""))
            if h.pod:
                gone = f", deleted {ago(snap.taken_at - h.pod_deleted_at)} ago" if h.pod_deleted_at else ""
                lines.append(f"    {h.reason} of pod {pod_ref(h.namespace, h.pod, h.container_name)}{gone}")
    leaky = {r.gpu_index for r in snap.residual if r.significant}
    last_tenants = [p for p in snap.pods if p.deleted_at is not None and leaky.intersection(p.gpus)]
    if last_tenants:
        # An ownerless leak has no holder to name; the pod the kubelet last gave the GPU to is the lead.
        lines.append("")
        for p in last_tenants:
            lines.append(f"GPU {','.join(map(str, p.gpus))} was last given to pod "
                         f"{pod_ref(p.namespace, p.pod, p.container_name)}, deleted {ago(snap.taken_at - p.deleted_at)} ago")
    if snap.engines:
        lines.append("")
        shown = [e.phase + (" (stale)" if e.stale else "") for e in snap.engines]
        width = max(12, *(len(p) for p in shown))  # failed-registration is longer than the others
        lines.append(f"{'ENGINE':<16} {'GPU':>3} {'PID':>8} {'PHASE':<{width}} EXIT")
        for e, phase in zip(snap.engines, shown):
            exit_s = e.signal or ("" if e.exit_code is None else f"code {e.exit_code}")
            lines.append(f"{e.name[:16]:<16} {'-' if e.gpu is None else e.gpu:>3} {e.pid or '-':>8} "
                         f"{phase:<{width}} {exit_s}")
        for e in snap.engines:
            if e.phase == FAILED_REGISTRATION:
                lines.append(registration_failure_line(e, snap.taken_at))
    if snap.arenas:
        lines.append("")
        for a in snap.arenas:
            regs = sum(1 for m in a.mappers if m.registered)
            lines.append(f"arena {a.path}: {fmt_bytes(a.size)}, header {a.header_state}, "
                         f"{len(a.mappers)} mapper(s), {regs} registered")
    if snap.driver:
        lines.append("")
        lines += driver_lines(snap.driver)
    if snap.kubernetes:
        lines.append("")
        lines.append(kubernetes_line(snap.kubernetes))
    if snap.warnings:
        lines.append("")
        for w in snap.warnings:
            lines.append(f"warning: {w}")
    lines.append("")
    stale = bool(snap.agent and snap.agent.get("stale"))
    if snap.needs_attention() or stale:
        lines.append("status: NEEDS ATTENTION: " + "; ".join(attention_reasons(snap) or ["see the lines above"]))
    else:
        lines.append("status: healthy")
    return "\n".join(lines)


def attention_reasons(snap: NodeSnapshot) -> list[str]:
    """What makes the report end NEEDS ATTENTION, one short phrase a cause, in the order of
    NodeSnapshot.needs_attention's tests (ops/foundation/model.py), so the last line says which problem it means."""
    reasons = []
    for r in snap.residual:
        if not (r.significant or r.holders):
            continue
        size = "" if r.residual is None else f"{fmt_bytes(r.residual)} "
        if r.holders:
            kinds = sorted({h.reason for h in r.holders})
            reasons.append(f"GPU {r.gpu_index}: {size}residual VRAM held by {len(r.holders)} "
                           f"{'holder' if len(r.holders) == 1 else 'holders'} ({', '.join(kinds)})")
        else:
            reasons.append(f"GPU {r.gpu_index}: {size}residual VRAM no process owns")
    reasons += [f"GPU {g.index} did not answer in time" for g in snap.gpus if g.stale is not None]
    reasons += [f"engine {e.name} {e.phase}" for e in snap.engines if e.phase in ATTENTION_PHASES]
    if snap.agent and snap.agent.get("stale"):
        reasons.append("the agent's data is stale")
    return reasons


def registration_failure_line(e: EngineInfo, now: float) -> str:
    """Why an engine in failed-registration needs attention, and what to do, on one line."""
    # deferred: keeps `gpuwarden status` cheap (0.25 ms there); only an engine whose registration failed needs it
    from gpuwarden.ops.engines import runtime_errors
    failed = next((r for r in reversed(e.registrations) if r.kind == "register" and r.outcome == "failed"), None)
    what = "a registration"
    if failed is not None:
        what = (f"{failed.call or 'registration'} of {fmt_bytes(failed.bytes)} returned "
                f"{runtime_errors.describe(failed.call, failed.result)}")
        if failed.started_at:
            what += f" {ago(now - failed.started_at)} ago"
    return (f"engine {e.name}: {what}; it runs without that memory registered. "
            f"Stop it (`gpuwarden engines stop {e.name}`) or fix the cause and restart it")

