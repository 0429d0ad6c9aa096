"""What gpuwarden_vram_fragmentation_ratio reads under serving workloads: the threshold of the opt-in alert.

A buddy allocator modelled on drivers/gpu/drm/drm_buddy.c (one root per set bit of the size, split to the order
asked, merge with a free buddy on free) serves amdgpu-like buffer objects (2 MiB minimum block, a BO taken as
power-of-two blocks largest first). Each workload prints the ratio (gpuwarden's, parse.VramFree.fragmentation)
and the old 1 - largest/free, sampled after every allocation or free while at least 1 GiB is free.
Run: .venv/bin/python tests/bench/bench_fragmentation.py [--seed 1] [--rounds 400]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO.parent))

from gpuwarden.ops.node.debugfs.parse import VramFree  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
BLOCK = 2 * MIB  # the smallest block amdgpu's VRAM manager hands a large BO (its pages_per_block)


class Buddy:
    """Free lists per order of BLOCK-sized units; blocks are (offset, order) in units."""

    def __init__(self, size: int):
        self.units = size // BLOCK
        self.free: dict[int, set[int]] = {}
        self.roots: list[tuple[int, int]] = []
        offset, left = 0, self.units
        while left:  # drm_buddy_init: largest power of two first, one root per set bit
            order = left.bit_length() - 1
            self.roots.append((offset, order))
            self.free.setdefault(order, set()).add(offset)
            offset += 1 << order
            left -= 1 << order
        self.root_of = {o: order for o, order in self.roots}

    def _take(self, order: int) -> int | None:
        for o in range(order, max(self.free, default=-1) + 1):
            if self.free.get(o):
                off = max(self.free[o])  # list_last_entry: the highest offset of that order
                self.free[o].discard(off)
                while o > order:  # split: keep the left half free, go on with the right one
                    o -= 1
                    self.free.setdefault(o, set()).add(off)
                    off += 1 << o
                return off
        return None

    def alloc(self, size: int) -> list[tuple[int, int]] | None:
        """A BO of `size` bytes as blocks, largest order first (drm_buddy_alloc_blocks); None when it cannot fit."""
        units = -(-size // BLOCK)
        got: list[tuple[int, int]] = []
        while units:
            order = units.bit_length() - 1
            while order >= 0:
                off = self._take(order)
                if off is not None:
                    got.append((off, order))
                    units -= 1 << order
                    break
                order -= 1
            if order < 0:
                for b in got:
                    self.release(*b)
                return None
        return got

    def release(self, off: int, order: int) -> None:
        while True:
            if self.root_of.get(off) == order:
                break
            buddy = off ^ (1 << order)
            if buddy not in self.free.get(order, ()):
                break
            self.free[order].discard(buddy)
            off, order = min(off, buddy), order + 1
        self.free.setdefault(order, set()).add(off)

    def books(self) -> VramFree:
        free = sum(len(s) << o for o, s in self.free.items()) * BLOCK
        largest = max(((1 << o) * BLOCK for o, s in self.free.items() if s), default=0)
        blocks = sum(len(s) for s in self.free.values())
        return VramFree("drm_buddy", self.units * BLOCK, free, largest, blocks)


def sample(b: Buddy, new: list[float], old: list[float]) -> None:
    v = b.books()
    if v.free >= GIB:
        new.append(v.fragmentation or 0.0)
        old.append(round(1 - v.largest_free_block / v.free, 4))


def engine(b: Buddy, rng: random.Random, weights: int, kv_share: float) -> list[list[tuple[int, int]]]:
    """An inference engine: its weights as many tensors (2 MiB .. 1 GiB), then a KV cache of kv_share of the rest."""
    bos = []
    left = weights
    while left > 0:
        size = min(left, int(2 ** rng.uniform(21, 30)))
        bo = b.alloc(size)
        if bo is None:
            break
        bos.append(bo)
        left -= size
    free = b.books().free
    for _ in range(8):  # KV cache: a few large tensors (one per layer group)
        bo = b.alloc(int(free * kv_share / 8))
        if bo:
            bos.append(bo)
    return bos


def workloads(size: int, rng: random.Random, rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = {}
    # 1. Idle: the manager as the driver makes it.
    b = Buddy(size)
    out["idle"] = ([b.books().fragmentation or 0.0], [round(1 - b.books().largest_free_block / b.books().free, 4)])
    # 2. Tenants come and go: 1-3 engines at a time, each with its weights and a KV cache, killed at random.
    b, new, old = Buddy(size), [], []
    tenants: list[list[list[tuple[int, int]]]] = []
    for _ in range(rounds):
        if tenants and (len(tenants) >= 3 or rng.random() < 0.45):
            for bo in tenants.pop(rng.randrange(len(tenants))):
                for blk in bo:
                    b.release(*blk)
        else:
            tenants.append(engine(b, rng, int(size * rng.uniform(0.05, 0.3)), rng.uniform(0.2, 0.6)))
        sample(b, new, old)
    out["tenant churn"] = (new, old)
    for t in tenants:
        for bo in t:
            for blk in bo:
                b.release(*blk)
    out["after churn, all gone"] = ([b.books().fragmentation or 0.0], [round(1 - b.books().largest_free_block /
                                                                            b.books().free, 4)])
    # 3. A caching allocator's churn: small and medium buffers (2 MiB .. 256 MiB) allocated and freed at random.
    b, new, old = Buddy(size), [], []
    live: list[list[tuple[int, int]]] = []
    for _ in range(rounds * 10):
        if live and (rng.random() < 0.5 or b.books().free < size // 4):
            for blk in live.pop(rng.randrange(len(live))):
                b.release(*blk)
        else:
            bo = b.alloc(int(2 ** rng.uniform(21, 28)))
            if bo:
                live.append(bo)
        sample(b, new, old)
    out["small-buffer churn"] = (new, old)
    # 4. The incident's pattern: VRAM filled with 2 MiB buffers, every other one freed (a leak that pins crumbs).
    b = Buddy(size)
    pieces = [bo for bo in iter(lambda: b.alloc(BLOCK), None)]
    for bo in pieces[::2]:
        b.release(*bo[0])
    v = b.books()
    out["crumbs (every other 2 MiB freed)"] = ([v.fragmentation or 0.0], [round(1 - v.largest_free_block / v.free, 4)])
    return out


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args()
    for label, size in (("MI210, 64 GiB less 16 MiB (65520 MiB)", 65520 * MIB), ("24 GiB", 24 * GIB),
                        ("MI300X, 192 GiB", 192 * GIB)):
        print(f"\n{label}: ratio (p50 / p95 / p99 / max, share > 0.25)   [old 1 - largest/free: p50 / max]")
        for name, (new, old) in workloads(size, random.Random(args.seed), args.rounds).items():
            over = sum(1 for v in new if v > 0.25) / len(new)
            print(f"  {name:34s} n={len(new):5d}  {pct(new, .5):.3f} / {pct(new, .95):.3f} / {pct(new, .99):.3f} / "
                  f"{max(new):.3f}, {over:5.1%}   [old {statistics.median(old):.3f} / {max(old):.3f}]")


if __name__ == "__main__":
    main()
