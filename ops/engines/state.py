"""Engine state as the shims recorded it (placeholder until supervision lands).

list_engines() feeds the snapshot.
"""

from __future__ import annotations

from ops.model import EngineInfo
from ops.settings import Settings


def list_engines(settings: Settings) -> list[EngineInfo]:
    return []
