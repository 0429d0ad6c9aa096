"""Builds amdgpu/KFD sysfs trees for tests out of the captured files in tests/fixtures.

Only the layout is synthesised; every file's content is a captured real one unless a test says so.
"""

from __future__ import annotations

from pathlib import Path


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def add_card(root: Path, card: int, *, vram_total: str, vram_used: str, bus: str | None = None,
             render_minor: int | None = None, extra: dict[str, str] | None = None) -> Path:
    dev = root / "class/drm" / f"card{card}" / "device"
    write(dev / "vendor", "0x1002\n")
    write(dev / "mem_info_vram_total", vram_total)
    write(dev / "mem_info_vram_used", vram_used)
    if bus:
        write(dev / "uevent", f"DRIVER=amdgpu\nPCI_SLOT_NAME={bus}\n")
    if render_minor is not None:
        (dev / "drm" / f"renderD{render_minor}").mkdir(parents=True, exist_ok=True)
    for name, text in (extra or {}).items():
        write(dev / name, text)
    return dev


def add_kfd_node(root: Path, node: int, gpu_id: int, properties: str, name: str = "") -> None:
    base = root / "class/kfd/kfd/topology/nodes" / str(node)
    write(base / "gpu_id", f"{gpu_id}\n")
    write(base / "name", f"{name}\n")
    write(base / "properties", properties)


def add_kfd_proc(root: Path, pid: int, gpu_id: int, vram: int) -> None:
    write(root / "class/kfd/kfd/proc" / str(pid) / f"vram_{gpu_id}", f"{vram}\n")
