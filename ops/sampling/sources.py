"""Where a viewer's snapshots come from: the live node through a Sampler, or an incident bundle.

A source is a function returning a NodeSnapshot; the viewer calls it from its SamplingThread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..model import NodeSnapshot
from ..settings import Settings

SnapshotSource = Callable[[], NodeSnapshot]


def live_source(settings: Settings) -> tuple[SnapshotSource, Callable[[], None]]:
    """The live node through a Sampler (opened here, so a missing GPU library fails before the screen)."""
    from .sampler import Sampler
    sampler = Sampler(settings)
    return sampler.snapshot, sampler.close


def bundle_source(path: Path, settings: Settings) -> SnapshotSource:
    """A captured node from an incident bundle; the same snapshot every time."""
    from ..bundle.replay import snapshot_from_bundle
    snap = snapshot_from_bundle(path, settings)
    return lambda: snap
