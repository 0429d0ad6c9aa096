"""DRM fdinfo: per-open-file GPU memory and engine time that amdgpu publishes in /proc/<pid>/fdinfo/<fd>.

Understands the common drm-* keys (drm-memory-*, drm-resident-*, drm-engine-* in ns, drm-engine-capacity-*),
the 5.19-6.3 per-ring engine keys (drm-engine-gfx0) and the pre-5.19 amdgpu format ("vram mem: N kB",
"gfx0: 70.59%"); one DRM client shared by several fds (dup, fork) is counted once, by (drm-pdev, drm-client-id).
"""

from __future__ import annotations

from gpuwarden.ops.foundation.records import field, record

_UNITS = {"": 1, "b": 1, "kb": 1024, "kib": 1024, "mb": 1 << 20, "mib": 1 << 20, "gb": 1 << 30, "gib": 1 << 30}
# amdgpu's engine (IP block) names, amdgpu_fdinfo.c amdgpu_ip_name: gfx, compute, dma, dec, enc, enc_1, jpeg.
# Kernels 5.19-6.3 printed one key per ring with its index appended (drm-engine-gfx0, drm-engine-compute3).
AMD_ENGINES = frozenset({"gfx", "compute", "dma", "dec", "enc", "enc_1", "jpeg"})


@record
class DrmClient:
    client_key: str  # drm-client-id, else pdev+pasid for the old format (ids may be unique per device only:
    # a reader that spans devices keys a client by (pdev, client_key))
    pdev: str | None
    vram_bytes: int | None
    gtt_bytes: int | None
    driver: str | None
    # Busy time per engine in ns since the client opened (drm-engine-<name>), rings of one engine summed.
    engine_ns: dict[str, int] = field(default_factory=dict)
    # drm-engine-capacity-<name>: identical engines behind one name (1 when absent, as the spec says).
    capacity: dict[str, int] = field(default_factory=dict)
    # Pre-5.19 amdgpu: the kernel's own busy percent per engine over its recent fences (no counters).
    percent: dict[str, float] = field(default_factory=dict)


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


def engine_name(raw: str) -> str:
    """An engine's name with a ring index taken off when what is left is an amdgpu engine (gfx0 -> gfx)."""
    if raw in AMD_ENGINES:
        return raw
    base = raw.rstrip("0123456789")
    return base if base in AMD_ENGINES else raw


def with_engines(client: DrmClient, engine_ns: dict[str, int]) -> DrmClient:
    """The same client with new engine times (what a busy client's next reading differs in)."""
    return DrmClient(client_key=client.client_key, pdev=client.pdev, vram_bytes=client.vram_bytes,
                     gtt_bytes=client.gtt_bytes, driver=client.driver, engine_ns=engine_ns, capacity=client.capacity,
                     percent=client.percent)


def engine_times(tail: bytes) -> dict[str, int] | None:
    """The busy ns per engine of fdinfo lines that are all drm-engine-* (capacity lines skipped); None when a line
    is something else (then the whole file must be parsed)."""
    out: dict[str, int] = {}
    for line in tail.split(b"\n"):
        if not line:
            continue
        key, sep, value = line.partition(b":")
        if not sep or not key.startswith(b"drm-engine-"):
            return None
        name = key[11:].decode(errors="replace").strip()
        if name.startswith("capacity-"):
            continue
        parts = value.split()
        if len(parts) != 2 or parts[1] != b"ns" or not parts[0].isdigit():
            return None
        engine = engine_name(name)
        out[engine] = out.get(engine, 0) + int(parts[0])
    return out


def parse(text: str) -> DrmClient | None:
    """One fdinfo file to a DrmClient; None when the fd is not a DRM client with memory or engine stats."""
    fields: dict[str, str] = {}
    engine_ns: dict[str, int] = {}
    capacity: dict[str, int] = {}
    percent: dict[str, float] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key.startswith("drm-engine-"):
            name = key[11:]
            number = value.split()[0] if value else ""
            if name.startswith("capacity-"):
                if number.isdigit() and int(number) > 0:  # the spec forbids 0: keep the default of one
                    capacity[name[9:]] = int(number)
            elif number.isdigit() and value.endswith("ns"):
                engine = engine_name(name)
                engine_ns[engine] = engine_ns.get(engine, 0) + int(number)
            continue
        if value.endswith("%") and engine_name(key) in AMD_ENGINES and key not in AMD_ENGINES:
            try:  # "gfx0: 70.59%": the pre-5.19 ring lines (always with a ring index)
                engine = engine_name(key)
                percent[engine] = max(percent.get(engine, 0.0), float(value[:-1]))
            except ValueError:
                pass
            continue
        fields[key] = value
    # Newer kernels: drm-resident-* is what drm-memory-* used to mean (memory actually placed there).
    vram = _pick(fields, "drm-memory-vram", "drm-resident-vram", "vram mem")
    gtt = _pick(fields, "drm-memory-gtt", "drm-resident-gtt", "gtt mem")
    if vram is None and gtt is None and not engine_ns and not percent:
        return None
    pdev = fields.get("drm-pdev") or fields.get("pdev")
    client = fields.get("drm-client-id")
    key = f"id:{client}" if client else f"pasid:{pdev}:{fields.get('pasid', '?')}"
    return DrmClient(client_key=key, pdev=pdev, vram_bytes=vram, gtt_bytes=gtt,
                     driver=fields.get("drm-driver"), engine_ns=engine_ns, capacity=capacity, percent=percent)


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
