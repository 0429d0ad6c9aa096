"""DRM fdinfo: per-open-file GPU memory that amdgpu publishes in /proc/<pid>/fdinfo/<fd>.

Understands the common drm-* keys (drm-memory-*, drm-resident-*) and the pre-5.19 amdgpu
format ("vram mem: N kB"); one DRM client shared by several fds is counted once.
"""

from __future__ import annotations

from dataclasses import dataclass

_UNITS = {"": 1, "b": 1, "kb": 1024, "kib": 1024, "mb": 1 << 20, "mib": 1 << 20, "gb": 1 << 30, "gib": 1 << 30}


@dataclass(frozen=True)
class DrmClient:
    client_key: str  # drm-client-id, else pdev+pasid for the old format
    pdev: str | None
    vram_bytes: int | None
    gtt_bytes: int | None
    driver: str | None


def _amount(value: str) -> int | None:
    parts = value.split()
    if not parts:
        return None
    try:
        number = int(parts[0])
    except ValueError:
        return None
    unit = parts[1].lower() if len(parts) > 1 else ""
    return number * _UNITS.get(unit, 1) if unit in _UNITS else None


def parse(text: str) -> DrmClient | None:
    """One fdinfo file to a DrmClient; None when the fd is not a DRM client with memory stats."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    # Newer kernels: drm-resident-* is what drm-memory-* used to mean (memory actually placed there).
    vram = _pick(fields, "drm-memory-vram", "drm-resident-vram", "vram mem")
    gtt = _pick(fields, "drm-memory-gtt", "drm-resident-gtt", "gtt mem")
    if vram is None and gtt is None:
        return None
    pdev = fields.get("drm-pdev") or fields.get("pdev")
    client = fields.get("drm-client-id")
    key = f"id:{client}" if client else f"pasid:{pdev}:{fields.get('pasid', '?')}"
    return DrmClient(client_key=key, pdev=pdev, vram_bytes=vram, gtt_bytes=gtt,
                     driver=fields.get("drm-driver"))


def _pick(fields: dict[str, str], *keys: str) -> int | None:
    for key in keys:
        if key in fields:
            return _amount(fields[key])
    return None


def totals(clients: list[DrmClient]) -> dict[str | None, tuple[int, int]]:
    """pdev -> (vram, gtt) bytes over distinct clients."""
    seen: set[str] = set()
    out: dict[str | None, tuple[int, int]] = {}
    for c in clients:
        if c.client_key in seen:
            continue
        seen.add(c.client_key)
        v, g = out.get(c.pdev, (0, 0))
        out[c.pdev] = (v + (c.vram_bytes or 0), g + (c.gtt_bytes or 0))
    return out
