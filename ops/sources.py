"""Where a viewer's snapshots come from: the node agent when its socket answers, else a Sampler here, or an
incident bundle. A source is a function returning a NodeSnapshot; the viewer calls it from its SamplingThread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from gpuwarden.ops.agent import client
from gpuwarden.ops.foundation.model import NodeSnapshot, snapshot_from_dict
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.bundle.replay import snapshot_from_bundle
from gpuwarden.ops.foundation.paths import AGENT_SOCKET
from gpuwarden.ops.node.backends.select import open_for_console
from gpuwarden.ops.sampling.sampler import Sampler

SnapshotSource = Callable[[], NodeSnapshot]


def live_source(settings: Settings) -> tuple[SnapshotSource, Callable[[], None]]:
    """The live node through a Sampler (opened here, so a missing GPU library fails before the screen)."""
    sampler = Sampler(settings, open_for_console(settings))
    return sampler.snapshot, sampler.close


def bundle_source(path: Path, settings: Settings) -> SnapshotSource:
    """A captured node from an incident bundle; the same snapshot every time."""
    snap = snapshot_from_bundle(path, settings)
    return lambda: snap


class AgentOrLocal:
    """Snapshots from the node agent while it answers; from a Sampler of our own while it does not.

    Many consoles over SSH then share the agent's one sampler; a stopped agent costs a refresh, not the view.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.socket = settings.state_dir / AGENT_SOCKET
        self._sampler: Sampler | None = None
        self.via_agent = False

    def _from_agent(self) -> NodeSnapshot | None:
        if self.settings.captured:
            return None
        reply = client.snapshot(self.settings.state_dir, self.settings.backend)
        if reply is None:
            return None
        return snapshot_from_dict(reply.json())

    def __call__(self) -> NodeSnapshot:
        snap = self._from_agent()
        self.via_agent = snap is not None
        if snap is not None:
            return snap
        if self._sampler is None:
            self._sampler = Sampler(self.settings, open_for_console(self.settings))
        return self._sampler.snapshot()

    def agent_json(self, target: str) -> dict[str, Any] | None:
        """Another document from the agent (history, events), for a viewer's backfill; None without one."""
        reply = client.get(self.socket, target)
        return reply.json() if reply is not None and reply.status == 200 else None

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None


def viewer_source(settings: Settings) -> tuple[SnapshotSource, Callable[[], None]]:
    """The agent's snapshots when one answers, else the live node sampled here (which must open now)."""
    source = AgentOrLocal(settings)
    if source._from_agent() is None:
        source._sampler = Sampler(settings, open_for_console(settings))  # fails here, before the screen
    return source, source.close
