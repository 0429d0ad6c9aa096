"""The journal a state dir keeps (journal.log, one JSON record a line), read back as the tests check it."""

from __future__ import annotations

import json
from pathlib import Path


def read_journal(state_dir: Path) -> list[dict]:
    """Every record so far, oldest first; none when nothing was journaled yet."""
    path = Path(state_dir) / "journal.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
