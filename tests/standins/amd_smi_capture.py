"""Turns captured amd-smi / rocm-smi output (tests/fixtures) into the readings a stand-in amdsmi replays;
what a capture does not show stays None, and the stand-in answers as the library does for it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# amd-smi prints binary units: "GB" is 1024**3 (amdsmi_cli's convert_bytes_to_readable)
_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


@dataclass
class ReplayProcess:
    pid: int
    name: str | None  # None: the library had no name ("N/A" on screen)
    vram: int | None = None
    gtt: int | None = None
    cpu: int | None = None
    mem: int | None = None  # the older total-memory figure ("mem" / MEM_USAGE)


@dataclass
class ReplayGpu:
    market_name: str | None = None
    bdf: str | None = None
    vram_total: int | None = None  # bytes
    vram_used: int | None = None
    gfx_activity: int | None = None  # percent
    hotspot_c: int | None = None
    mem_temp_c: int | None = None
    socket_power_w: int | None = None
    processes: list[ReplayProcess] = field(default_factory=list)


@dataclass
class ReplayNode:
    label: str
    gpus: list[ReplayGpu]


def size(text: str) -> int | None:
    """"2.8 GB" -> bytes (binary units); "N/A" -> None."""
    text = text.strip()
    if text in ("N/A", ""):
        return None
    value, unit = text.split()
    return round(float(value) * _UNITS[unit])


def leading_int(text: str) -> int | None:
    match = re.match(r"\s*(-?\d+)", text)
    return int(match.group(1)) if match else None


def _table(lines: list[str]) -> list[dict[str, str]]:
    """An amd-smi text table: a header of single-word columns, cells separated by 2+ spaces."""
    header = lines[0].split()
    rows = []
    for line in lines[1:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(header):
            raise ValueError(f"row does not match header {header}: {line!r}")
        rows.append(dict(zip(header, cells)))
    return rows


def monitor_node(path: Path) -> ReplayNode:
    """`amd-smi monitor` (optionally with --process): one row per GPU, then a PROCESS INFO table."""
    lines = path.read_text().splitlines()
    gpus = []
    for row in _table(lines):
        used, _, total = row["VRAM_USAGE"].partition("/")
        unit = total.split()[1]
        gpus.append(ReplayGpu(
            socket_power_w=leading_int(row["POWER"]), hotspot_c=leading_int(row["GPU_T"]),
            mem_temp_c=leading_int(row["MEM_T"]), gfx_activity=leading_int(row["GFX%"]),
            vram_used=size(f"{used} {unit}"), vram_total=size(total)))
    if "PROCESS INFO:" in lines:
        start = lines.index("PROCESS INFO:") + 1
        for row in _table(lines[start:]):
            gpus[int(row["GPU"])].processes.append(ReplayProcess(
                pid=int(row["PID"]), name=None if row["NAME"] == "N/A" else row["NAME"],
                vram=size(row["VRAM_MEM"]), gtt=size(row["GTT_MEM"]), cpu=size(row["CPU_MEM"]),
                mem=size(row["MEM_USAGE"])))
    return ReplayNode(path.name, gpus)


def _nested(path: Path) -> dict[int, dict[str, str]]:
    """amd-smi's indented "KEY: value" text, flattened per GPU to {"SECTION.KEY": value}."""
    out: dict[int, dict[str, str]] = {}
    gpu, stack = None, []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 4
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if depth == 0 and key == "GPU":
            gpu, stack = int(value), []
            out[gpu] = {}
            continue
        stack = stack[:depth - 1] + [key]
        if value:
            out[gpu][".".join(stack)] = value
    return out


def process_text_node(path: Path) -> ReplayNode:
    """`amd-smi process` text: PROCESS_INFO blocks under each GPU."""
    gpus = []
    for _, fields in sorted(_nested(path).items()):
        name = fields["PROCESS_INFO.NAME"]
        gpus.append(ReplayGpu(processes=[ReplayProcess(
            pid=int(fields["PROCESS_INFO.PID"]), name=None if name == "N/A" else name,
            vram=size(fields["PROCESS_INFO.MEMORY_USAGE.VRAM_MEM"]),
            gtt=size(fields["PROCESS_INFO.MEMORY_USAGE.GTT_MEM"]),
            cpu=size(fields["PROCESS_INFO.MEMORY_USAGE.CPU_MEM"]),
            mem=size(fields["PROCESS_INFO.MEM_USAGE"]))]))
    return ReplayNode(path.name, gpus)


def static_node(path: Path) -> ReplayNode:
    """`amd-smi static`: ASIC market name and BUS BDF per GPU."""
    gpus = [ReplayGpu(market_name=f.get("ASIC.MARKET_NAME"), bdf=f.get("BUS.BDF"))
            for _, f in sorted(_nested(path).items())]
    return ReplayNode(path.name, gpus)


def process_json_node(path: Path) -> ReplayNode:
    """`amd-smi process --json` (ROCm 6.3 schema): mem_usage {value, unit} per process."""
    gpus = []
    for entry in json.loads(path.read_text()):
        procs = []
        for item in entry["process_list"]:
            info = item["process_info"]
            mem = info["mem_usage"]
            procs.append(ReplayProcess(pid=info["pid"], name=info["name"],
                                       mem=size(f"{mem['value']} {mem['unit']}")))
        gpus.append(ReplayGpu(processes=procs))
    return ReplayNode(path.name, gpus)


def rocm_smi_all_node(path: Path) -> ReplayNode:
    """`rocm-smi -a` ("GPU[i]\\t\\t: Key: value"): the same rocm_smi_lib readings amdsmi wraps."""
    fields: dict[int, dict[str, str]] = {}
    for line in path.read_text().splitlines():
        match = re.match(r"GPU\[(\d+)\]\s*:\s*(.+?):\s*(.*)$", line)
        if match:
            fields.setdefault(int(match.group(1)), {}).setdefault(match.group(2).strip(), match.group(3).strip())
    gpus = []
    for _, f in sorted(fields.items()):
        def reading(key: str, f=f) -> int | None:
            value = f.get(key)
            return None if value is None else round(float(value))
        gpus.append(ReplayGpu(
            market_name=f.get("Card series"), bdf=f.get("PCI Bus"),
            hotspot_c=reading("Temperature (Sensor junction) (C)"),
            mem_temp_c=reading("Temperature (Sensor memory) (C)"),
            socket_power_w=reading("Current Socket Graphics Package Power (W)"),
            gfx_activity=reading("GPU use (%)")))
    return ReplayNode(path.name, gpus)
