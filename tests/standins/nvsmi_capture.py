"""Reads captured `nvidia-smi -q` text or `--query-gpu` CSV (tests/fixtures/nvidia) into the per-GPU
readings a stand-in pynvml replays, whichever driver's key spellings the capture uses.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20


@dataclass
class SmiProcess:
    pid: int
    kind: str  # "C", "G" or "C+G"
    name: str
    used_mib: int | None  # None: nvidia-smi printed N/A


@dataclass
class SmiGpu:
    bus_id: str  # as nvidia-smi prints it: 00000000:18:00.0
    fields: dict[str, str]
    processes: list[SmiProcess] = field(default_factory=list)

    def get(self, *keys: str) -> str | None:
        """The first key present: spellings differ by driver (565 "Gpu", "Power Draw"; 590 "GPU", ...)."""
        for key in keys:
            value = self.fields.get(key)
            if value is not None and value not in ("N/A", "[N/A]"):
                return value
        return None

    def number(self, *keys: str) -> float | None:
        value = self.get(*keys)
        if value is None:
            return None
        match = re.match(r"-?\d+(\.\d+)?", value)
        return float(match.group(0)) if match else None

    @property
    def name(self) -> str:
        return self.fields["Product Name"]

    @property
    def uuid(self) -> str:
        return self.fields["GPU UUID"]

    @property
    def minor(self) -> int | None:
        value = self.get("Minor Number")
        return None if value is None else int(value)

    def fb(self, key: str) -> int:
        """FB Memory Usage figure in bytes (nvidia-smi prints whole MiB)."""
        return int(self.number(f"FB Memory Usage.{key}")) * MIB

    @property
    def utilization(self) -> float | None:
        return self.number("Utilization.GPU", "Utilization.Gpu")

    @property
    def temperature(self) -> float | None:
        return self.number("Temperature.GPU Current Temp")

    @property
    def power_w(self) -> float | None:
        # What nvmlDeviceGetPowerUsage reports on Hopper: the 1 s average (NVML reference).
        return self.number("GPU Power Readings.Average Power Draw", "GPU Power Readings.Power Draw")


def parse_q(path: Path) -> list[SmiGpu]:
    gpus: list[SmiGpu] = []
    stack: list[str] = []
    proc: dict[str, str] | None = None
    for raw in path.read_text().splitlines():
        if not raw.strip():
            continue
        if raw.startswith("GPU "):
            gpus.append(SmiGpu(bus_id=raw.split()[1], fields={}))
            stack, proc = [], None
            continue
        if not gpus or not raw.startswith("    "):
            continue
        depth = (len(raw) - len(raw.lstrip())) // 4  # 1 = a GPU's top-level key
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        stack = stack[:depth - 1] + [key]
        gpu = gpus[-1]
        if stack[0] == "Processes" and depth > 1:
            if key == "GPU instance ID":
                proc = {}
            if proc is not None:
                proc[key] = value
                if key == "Used GPU Memory":
                    used = re.match(r"(\d+) MiB", value)
                    gpu.processes.append(SmiProcess(
                        pid=int(proc["Process ID"]), kind=proc.get("Type", "C"), name=proc.get("Name", ""),
                        used_mib=int(used.group(1)) if used else None))
                    proc = None
            continue
        if sep and value:
            gpu.fields[".".join(stack)] = value
    return gpus


# --query-gpu CSV column -> the -q report's key for the same reading
_CSV_TO_Q = {
    "name": "Product Name", "uuid": "GPU UUID", "memory.total [MiB]": "FB Memory Usage.Total",
    "memory.reserved [MiB]": "FB Memory Usage.Reserved", "memory.used [MiB]": "FB Memory Usage.Used",
    "memory.free [MiB]": "FB Memory Usage.Free", "utilization.gpu [%]": "Utilization.GPU",
    "utilization.memory [%]": "Utilization.Memory", "temperature.gpu": "Temperature.GPU Current Temp",
    "power.draw.average [W]": "GPU Power Readings.Average Power Draw",
    "persistence_mode": "Persistence Mode", "mig.mode.current": "MIG Mode.Current",
    "mig.mode.pending": "MIG Mode.Pending", "ecc.mode.current": "ECC Mode.Current",
    "ecc.mode.pending": "ECC Mode.Pending", "retired_pages.pending": "Retired Pages.Pending Page Blacklist",
    "remapped_rows.correctable": "Remapped Rows.Correctable Error",
    "remapped_rows.uncorrectable": "Remapped Rows.Uncorrectable Error", "remapped_rows.pending": "Remapped Rows.Pending",
    "remapped_rows.failure": "Remapped Rows.Remapping Failure Occurred", "vbios_version": "VBIOS Version",
}


def parse_query_csv(query_gpu: Path, compute_apps: Path | None = None) -> list[SmiGpu]:
    """`nvidia-smi --query-gpu=... --format=csv` (+ `--query-compute-apps`) as the same readings."""
    rows = list(csv.reader(query_gpu.read_text().splitlines(), skipinitialspace=True))
    gpus = []
    for row in rows[1:]:
        cells = dict(zip(rows[0], row))
        fields = {q: cells[c] for c, q in _CSV_TO_Q.items() if c in cells}
        gpus.append(SmiGpu(bus_id=cells["pci.bus_id"], fields=fields))
    if compute_apps is not None:
        apps = list(csv.reader(compute_apps.read_text().splitlines(), skipinitialspace=True))
        header = apps[0]
        for row in apps[1:]:
            cells = dict(zip(header, row))
            gpu = next(g for g in gpus if g.bus_id == cells["gpu_bus_id"])
            used = re.match(r"(\d+) MiB", cells["used_gpu_memory [MiB]"])
            gpu.processes.append(SmiProcess(pid=int(cells["pid"]), kind="C", name=cells["process_name"],
                                            used_mib=int(used.group(1)) if used else None))
    return gpus
