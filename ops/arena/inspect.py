"""`arena inspect`: what the header says, whether it checks out (cheap check, no hashing), and who maps it.

Returns plain data for --json and for the table the CLI prints.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuwarden.ops.arena import format as fmt
from gpuwarden.ops.arena.mappers import find_mappers


def inspect(path: str | Path, proc_root: Path = Path("/proc"), state_dir: Path | None = None) -> dict[str, Any]:
    """Header fields (when readable), header_state, problem (message) and mappers with Rss/Pss."""
    out: dict[str, Any] = {"path": str(path)}
    try:
        header = fmt.load_header(path)
        out.update(header_state="ok", problem=None, **header.summary())
    except fmt.ArenaError as exc:
        # Still look for mappers: a deleted or unreadable arena can be mapped all the same.
        out.update(header_state=exc.kind, problem=exc.message)
    mappers = find_mappers(path, proc_root, state_dir=state_dir)
    out["mappers"] = [asdict(m) for m in mappers]
    return out
