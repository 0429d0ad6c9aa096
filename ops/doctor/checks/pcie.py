"""Platform checks: IOMMU mode, PCIe ACS above the GPUs, link width/speed, large BAR, NUMA placement.

Facts: AMD's IOMMU page (ROCm/amdgpu-docs docs/conceptual/iommu.rst: passthrough `iommu=pt` recommended for Instinct,
`iommu=off` not recommended; Instinct peers use XGMI, not PCIe) and its MI300X system optimization page (`iommu=pt`,
`intel_iommu=on iommu=pt` on Intel hosts, Above 4G decoding for large BAR, numa_balancing=0 after testing). Linux
drivers/pci/pci-sysfs.c (current_link_speed "16.0 GT/s PCIe", *_link_width lanes), the PCIe base spec (extended
capabilities from offset 0x100; ACS is capability 0x000D, its control register at +6: bit 2 request redirect,
bit 3 completion redirect), drivers/iommu (iommu_groups/N/type: identity, DMA, DMA-FQ).
"""

from __future__ import annotations

import os
import re
import struct
from typing import TypedDict

from gpuwarden.ops.node.backends.sysfs import AMD_VENDOR
from gpuwarden.ops.engines import state as engine_state
from gpuwarden.ops.doctor.model import Result, fail, passed, skip, unknown, warn
from gpuwarden.ops.doctor.node import NVIDIA_VENDOR, amd_gpus, cmdline, cmdline_value, readable_cpus
from gpuwarden.ops.doctor.probe import CheckIO

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ACS_ID = 0x000D
ACS_REDIRECT = (1 << 2) | (1 << 3)  # request redirect, completion redirect


def gpu_cards(io: CheckIO) -> list[tuple[str, int]]:
    """(card, vendor) for every AMD or NVIDIA card under class/drm of the GPU tree."""
    out = []
    for card in io.listdir("gpu", "class/drm"):
        if card.startswith("card") and card[4:].isdigit():
            vendor = io.int("gpu", f"class/drm/{card}/device/vendor")
            if vendor in (AMD_VENDOR, NVIDIA_VENDOR):
                out.append((card, vendor))
    return sorted(out, key=lambda c: int(c[0][4:]))


def upstream_bridges(io: CheckIO, card: str) -> list[str] | None:
    """PCI addresses of the bridges above a card, root port first, from where its sysfs device really lives;
    None when the tree does not say (a captured or simulated tree keeps no /sys/devices hierarchy)."""
    root = os.path.realpath(io.roots.gpu)
    real = os.path.realpath(os.path.join(io.roots.gpu, f"class/drm/{card}/device"))
    if not real.startswith(root + os.sep):
        return None
    parts = real[len(root) + 1:].split(os.sep)
    if not parts or parts[0] != "devices":
        return None
    chain = [p for p in parts if BDF.match(p)]
    return chain[:-1] if len(chain) > 1 else None


def _device_rel(io: CheckIO, card: str, bdf: str) -> str:
    real = os.path.realpath(os.path.join(io.roots.gpu, f"class/drm/{card}/device"))
    rel = os.path.relpath(real, os.path.realpath(io.roots.gpu))
    return rel[:rel.index(bdf) + len(bdf)]


def acs_control(config: bytes) -> int | None:
    """The ACS control register from a PCI config space, None when the device has no ACS capability;
    raises ValueError when the extended space (past 256 bytes) was not readable."""
    if len(config) <= 0x100:
        raise ValueError("extended config space not readable")
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        header = struct.unpack_from("<I", config, offset)[0]
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_ID:
            return int(struct.unpack_from("<H", config, offset + 6)[0])
        offset = (header >> 20) & 0xFFC
        if offset == 0:
            return None
    return None


def _in_hive(io: CheckIO) -> bool:
    gpus = amd_gpus(io)
    return bool(gpus) and all(g.props.get("hive_id") for g in gpus)


def check_acs(io: CheckIO) -> Result:
    cards = gpu_cards(io)
    if len(cards) < 2:
        return skip("fewer than two GPUs: no peer-to-peer traffic to route")
    redirecting: dict[str, list[str]] = {}
    unreadable, unknown_paths = [], []
    for card, _ in cards:
        bridges = upstream_bridges(io, card)
        if bridges is None:
            unknown_paths.append(card)
            continue
        for bdf in bridges:
            config = io.bytes("gpu", f"{_device_rel(io, card, bdf)}/config")
            if config is None:
                unreadable.append(bdf)
                continue
            try:
                ctl = acs_control(config)
            except ValueError:
                unreadable.append(bdf)
                continue
            if ctl is not None and ctl & ACS_REDIRECT:
                redirecting.setdefault(bdf, []).append(card)
    details = {"redirecting_bridges": sorted(redirecting), "unreadable": sorted(set(unreadable))}
    if len(unknown_paths) == len(cards):
        return skip("this tree keeps no PCI hierarchy above the GPUs (a captured or simulated node)")
    hive = _in_hive(io)
    if redirecting:
        where = ", ".join(sorted(redirecting))
        if hive:
            return passed(f"ACS redirect is on at {where}, but the GPUs are one XGMI hive and talk over XGMI, which "
                          "ACS does not touch (peer traffic to NICs still goes through the root complex)", **details)
        return warn(f"ACS request/completion redirect is on at bridge(s) {where} above the GPUs: GPU peer-to-peer "
                    "traffic is sent up to the root complex (slower, or blocked by the IOMMU) instead of across the "
                    "switch", "disable ACS in the BIOS (PCIe ACS), or until reboot: "
                    f"setpci -s {sorted(redirecting)[0]} ECAP_ACS+0x6.w=0000 (for each bridge listed); on a VM host "
                    "ACS must stay on for device passthrough", **details)
    if unreadable:
        return unknown(f"cannot read the extended config space of {len(set(unreadable))} bridge(s) above the GPUs "
                       "(it takes root)", "run gpuwarden doctor as root", **details)
    return passed("no bridge above the GPUs redirects peer-to-peer requests (ACS redirect off or absent)", **details)


def parse_speed(text: str | None) -> float | None:
    """'16.0 GT/s PCIe' (or an older kernel's '8 GT/s') -> 16.0."""
    m = re.match(r"\s*([\d.]+)\s*GT/s", text or "")
    return float(m[1]) if m else None


def dpm_level(text: str | None) -> tuple[int, int] | None:
    """pp_dpm_pcie ('0: 2.5GT/s, x1 310Mhz\\n1: 16.0GT/s, x16 619Mhz *') -> (active level, number of levels)."""
    lines = [ln for ln in (text or "").splitlines() if re.match(r"\s*\d+:", ln)]
    for i, line in enumerate(lines):
        if line.rstrip().endswith("*"):
            return i, len(lines)
    return None


def check_link(io: CheckIO) -> Result:
    cards = gpu_cards(io)
    if not cards:
        return skip("no GPU under /sys/class/drm")
    narrow, slow, idle, seen = [], [], [], {}
    for card, _vendor in cards:
        dev = f"class/drm/{card}/device"
        places = [(dev, card)]
        for bdf in upstream_bridges(io, card) or []:
            places.append((_device_rel(io, card, bdf), f"{card}'s bridge {bdf}"))
        for where, label in places:
            cw, mw = io.int("gpu", f"{where}/current_link_width"), io.int("gpu", f"{where}/max_link_width")
            cs = parse_speed(io.line("gpu", f"{where}/current_link_speed"))
            ms = parse_speed(io.line("gpu", f"{where}/max_link_speed"))
            if cw is None and cs is None:
                continue
            seen[label] = f"x{cw} of x{mw}, {cs:g} of {ms:g} GT/s" if None not in (cw, mw, cs, ms) else "partial"
            if cw and mw and cw < mw:
                narrow.append(f"{label} x{cw} of x{mw}")
            if cs and ms and cs < ms:
                level = dpm_level(io.line("gpu", f"{dev}/pp_dpm_pcie")) if where == dev else None
                if level and level[0] < level[1] - 1:
                    idle.append(f"{label} {cs:g} of {ms:g} GT/s (power-managed: pp_dpm_pcie level {level[0]} of "
                                f"{level[1] - 1})")
                elif level:
                    slow.append(f"{label} {cs:g} of {ms:g} GT/s at its top power level")
                else:
                    idle.append(f"{label} {cs:g} of {ms:g} GT/s")
    if not seen:
        return unknown("no link attributes (current_link_width/speed) under the GPUs' devices")
    details = {"links": seen, "narrow": narrow, "slow": slow, "below_max_speed": idle}
    if narrow:
        return fail(f"link trained narrower than it can: {'; '.join(narrow)} — host<->GPU bandwidth (arena copies, "
                    "weights loads) drops in proportion", "reseat the GPU or its riser/cable, check the slot's "
                    "bifurcation setting in the BIOS; `lspci -vv -s <bus>` shows LnkSta against LnkCap", **details)
    if slow:
        return warn(f"link slower than it can be: {'; '.join(slow)}",
                    "check the slot's PCIe generation setting in the BIOS and the riser; `lspci -vv` LnkSta", **details)
    if idle:
        return unknown(f"link speed below its maximum: {'; '.join(idle)}. GPUs lower link speed when idle; "
                       "re-run under load to tell power saving from a degraded link", **details)
    return passed(f"every GPU link at its maximum width and speed ({len(seen)} link(s))", **details)


def check_large_bar(io: CheckIO) -> Result:
    gpus = [g for g in amd_gpus(io) if g.dev]
    if not gpus:
        return skip("no AMD GPU (NVIDIA's BAR1 is reported by nvidia-smi -q)")
    small, sizes = [], {}
    for g in gpus:
        vis = io.int("gpu", f"{g.dev}/mem_info_vis_vram_total")
        total = io.int("gpu", f"{g.dev}/mem_info_vram_total")
        if vis is None or total is None:
            continue
        sizes[g.index] = {"visible": vis, "total": total}
        if vis < total:
            small.append(f"GPU {g.index} {vis >> 20} MiB of {total >> 20} MiB")
    if not sizes:
        return unknown("mem_info_vis_vram_total / mem_info_vram_total not readable")
    if small:
        return warn(f"the CPU sees only part of VRAM (no large BAR): {'; '.join(small)}; CPU access to VRAM and "
                    "PCIe peer-to-peer into it go through a small window",
                    "enable Above 4G decoding and Resizable BAR in the BIOS (AMD's MI300X settings: "
                    "Above 4G decoding = Enabled, \"GPU large BAR support\")", sizes=sizes)
    return passed(f"large BAR: the CPU sees all of VRAM on {len(sizes)} GPU(s)", sizes=sizes)


def _engine_cpus(io: CheckIO) -> dict[str, tuple[int | None, set[int]]]:
    """{engine: (its GPU, CPUs it may run on)} for engines running now, from their records and /proc."""
    out: dict[str, tuple[int | None, set[int]]] = {}
    try:
        names = engine_state.names(io.settings.state_dir)
    except OSError:
        return out
    for name in names:
        try:
            record = engine_state.read_state(io.settings.state_dir, name) or {}
        except Exception:
            continue
        pid = record.get("pid")
        if not isinstance(pid, int):
            continue
        status = io.text("proc", f"{pid}/status") or ""
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
        if m:
            spec = engine_state.read_spec(io.settings.state_dir, name) or {}
            gpu = (spec.get("engine") or {}).get("gpu") if isinstance(spec.get("engine"), dict) else None
            out[name] = (gpu if isinstance(gpu, int) else None, readable_cpus(m[1]))
    return out


class _Placement(TypedDict):
    numa_node: int | None
    cpus: str | None  # local_cpulist


def check_numa(io: CheckIO) -> Result:
    nodes = readable_cpus(io.line("sys", "devices/system/node/online"))
    gpus = [g for g in amd_gpus(io) if g.dev]
    placement: dict[int, _Placement] = {}
    for g in gpus:
        node = io.int("gpu", f"{g.dev}/numa_node")
        placement[g.index] = {"numa_node": node, "cpus": io.line("gpu", f"{g.dev}/local_cpulist")}
    balancing = io.int("proc", "sys/kernel/numa_balancing")
    details: dict[str, object] = {"numa_nodes": sorted(nodes), "gpus": placement, "numa_balancing": balancing}
    if len(nodes) <= 1:
        return passed(f"one NUMA node{'' if nodes else ' (or none reported)'}: every CPU is as close to every GPU",
                      **details)
    problems = []
    engines = _engine_cpus(io)
    for name, (gpu, cpus) in engines.items():
        at = placement.get(gpu) if gpu is not None else None
        local = readable_cpus(at["cpus"]) if at is not None else set()
        if at is not None and local and cpus - local:
            problems.append(f"engine {name} may run on {len(cpus - local)} CPU(s) outside GPU {gpu}'s NUMA node "
                            f"{at['numa_node']}")
    if any(p["numa_node"] == -1 for p in placement.values()):
        problems.append("a GPU has no NUMA node (numa_node -1: the firmware's ACPI tables do not say)")
    details["engines_checked"] = sorted(engines)
    fixes = []
    if problems:
        fixes.append("pin each engine to its GPU's node: prefix its argv with "
                     "numactl --cpunodebind=<node> --membind=<node> (the node is /sys/class/drm/cardN/device/numa_node)")
    if balancing == 1:
        problems.append("automatic NUMA balancing is on (kernel.numa_balancing=1); AMD's MI300X guide advises 0 "
                        "for GPU workloads, after testing")
        fixes.append("sysctl -w kernel.numa_balancing=0 (and kernel.numa_balancing = 0 in /etc/sysctl.d/)")
    if problems:
        return warn("; ".join(problems), "; ".join(fixes), **details)
    where = ", ".join(f"GPU {i}: node {p['numa_node']}" for i, p in placement.items())
    return passed(f"{len(nodes)} NUMA nodes; {where or 'no AMD GPU placement read'}; running engines stay on their "
                  f"GPU's node" + ("" if engines else " (no engine running to check)"), **details)


def _iommu_mode(io: CheckIO) -> tuple[str, str]:
    """(passthrough | translated | disabled, why) from the GPUs' IOMMU groups, else the command line."""
    types = set()
    for g in amd_gpus(io):
        if g.dev:
            t = io.line("gpu", f"{g.dev}/iommu_group/type")
            if t:
                types.add(t)
    args = cmdline(io)
    hardware = io.listdir("sys", "class/iommu")
    io.note("/sys/class/iommu")
    if types:
        if types == {"identity"}:
            return "passthrough", "the GPUs' IOMMU groups are of type identity"
        return "translated", f"the GPUs' IOMMU groups are of type {', '.join(sorted(types))}"
    iommu = cmdline_value(args, "iommu")
    if iommu == "off" or cmdline_value(args, "amd_iommu") == "off" or cmdline_value(args, "intel_iommu") == "off":
        return "disabled", "the kernel command line turns it off"
    if iommu == "pt" or cmdline_value(args, "iommu.passthrough") in ("1", "y", "on"):
        return "passthrough", "the kernel command line sets passthrough"
    if not hardware:
        return "disabled", "no IOMMU under /sys/class/iommu"
    return "translated", f"{', '.join(hardware)} active and no passthrough on the command line"


def _grub_fix(io: CheckIO) -> str:
    cpu = io.text("proc", "cpuinfo") or ""
    words = "intel_iommu=on iommu=pt" if "GenuineIntel" in cpu else "iommu=pt"
    return f"add {words} to GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub (or grub2-mkconfig), reboot"


def check_iommu(io: CheckIO) -> Result:
    mode, why = _iommu_mode(io)
    amd = bool(amd_gpus(io))
    details = {"mode": mode, "why": why}
    if not amd:
        return passed(f"IOMMU {mode} ({why})", **details)
    if mode == "passthrough":
        return passed(f"IOMMU passthrough ({why}), as AMD recommends for Instinct GPUs", **details)
    if mode == "disabled":
        return warn(f"IOMMU disabled ({why}): AMD does not recommend it (and on hosts with 256+ CPU threads it can "
                    "limit Linux to 255 cores)", _grub_fix(io) + "; enable IOMMU in the BIOS", **details)
    return warn(f"IOMMU translating DMA ({why}): AMD recommends passthrough (iommu=pt) for Instinct GPUs; "
                "translation costs DMA throughput (Radeon GPUs that need PCIe peer-to-peer may keep it)",
                _grub_fix(io), **details)
