"""What an upstream report's environment section needs, read from a bundle's members: GPUs with their gfx
target, driver and runtime versions, kernel and its command line, amdgpu parameters, firmware versions.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from gpuwarden.ops.foundation import jsondoc

Reader = Callable[[str], "bytes | None"]
_LIB = re.compile(r"lib(amdhip64|hsa-runtime64|rccl|cudart|cuda|nccl|nvidia-ml)\.so\.([\d.]+)")


def _text(read: Reader, rel: str) -> str | None:
    data = read(rel)
    return data.decode("utf-8", errors="replace").strip() if data else None


def _json_object(read: Reader, rel: str) -> dict[str, Any]:
    """A member gpuwarden writes as one JSON object; {} when absent, unreadable or of another shape."""
    data = read(rel)
    try:
        value = jsondoc.loads(data) if data else None  # a bundle's: nesting bounded
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def gfx_name(target_version: int) -> str:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping) as an LLVM target: 90402 -> gfx942."""
    major, minor, step = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def _kfd_targets(read: Reader, names: list[str]) -> dict[int, str]:
    """gfx target per KFD node (GPU nodes only), in node order."""
    out: dict[int, str] = {}
    for rel in names:
        m = re.fullmatch(r"tree/sys/class/kfd/kfd/topology/nodes/(\d+)/properties", rel)
        if not m:
            continue
        props = dict(line.split(None, 1) for line in (_text(read, rel) or "").splitlines() if " " in line)
        v = props.get("gfx_target_version", "0").strip()
        if v.isdigit() and int(v):
            out[int(m[1])] = gfx_name(int(v))
    return out


def collect(read: Reader, names: list[str]) -> dict[str, Any]:
    versions = _json_object(read, "node/versions.json")
    snapshot = _json_object(read, "gpuwarden/snapshot.json")
    kernel = versions.get("kernel")
    if not isinstance(kernel, dict):
        kernel = {}
    targets = list(_kfd_targets(read, names).values())
    gpus = []
    for i, g in enumerate(snapshot.get("gpus") or []):
        if isinstance(g, dict):
            gpus.append({"index": g.get("index"), "name": g.get("name"), "vendor": g.get("vendor"),
                         "bus_id": g.get("bus_id"), "vram_total": g.get("vram_total"),
                         "gfx_target": targets[i] if i < len(targets) else None})
    libs: dict[str, str] = {}
    for paths in (versions.get("gpu_libraries_by_pid") or {}).values():
        for p in paths if isinstance(paths, list) else ():
            m = _LIB.search(str(p))
            if m:
                libs.setdefault(f"lib{m[1]}", m[2])
    params = {}
    firmware: dict[str, dict[str, str]] = {}
    for rel in names:
        if rel.startswith("tree/sys/module/amdgpu/parameters/"):
            params[rel.rsplit("/", 1)[1]] = _text(read, rel)
        m = re.fullmatch(r"tree/sys/class/drm/(card\d+)/device/fw_version/(\w+)_fw_version", rel)
        if m:
            firmware.setdefault(m[1], {})[m[2]] = _text(read, rel) or ""
    return {
        "host": snapshot.get("hostname"), "backend": snapshot.get("backend"),
        "simulated": bool(snapshot.get("simulated")), "gpus": gpus,
        "kernel": kernel.get("release"), "kernel_version": kernel.get("version"), "machine": kernel.get("machine"),
        "platform": versions.get("platform"), "amdgpu_module": versions.get("amdgpu_module"),
        "nvidia_driver": versions.get("nvidia_module"), "gpu_libraries": libs,
        "kernel_cmdline": _text(read, "tree/proc/cmdline"), "amdgpu_parameters": params, "firmware": firmware,
        "gpuwarden": versions.get("gpuwarden"),
    }
