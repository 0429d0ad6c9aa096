"""Arenas for the snapshot (placeholder until the arena issue lands).

list_arenas() feeds the snapshot.
"""

from __future__ import annotations

from ops.model import ArenaInfo
from ops.settings import Settings


def list_arenas(settings: Settings) -> list[ArenaInfo]:
    return []
