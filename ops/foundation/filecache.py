"""Small files read on every refresh (state records, the node config, log tails), parsed again only when they change.

A FileCache belongs to one sampler; a file counts as unchanged while its mtime, size and inode are.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Callable


class FileCache:
    """path + parser -> last result; entries not asked for during a whole refresh are dropped by sweep()."""

    def __init__(self) -> None:
        # (path, parser name) -> (stat key, generation last used, value or error)
        self._hits: dict[tuple[str, str], tuple[tuple[int, int, int], int, Any, GpuwardenError | None]] = {}
        self._generation = 0

    def get(self, path: Path | str, parse: Callable[[Path], Any], kind: str, missing: Any = None) -> Any:
        """parse(path), or the value it gave while the file is unchanged; `missing` when there is no file.

        A GpuwardenError from parse (a corrupt record, a config with a typo) is remembered and raised again.
        """
        path_s = str(path)
        key = (path_s, kind)
        try:
            st = os.stat(path_s)
        except (FileNotFoundError, NotADirectoryError):
            self._hits.pop(key, None)
            return missing
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        hit = self._hits.get(key)
        if hit is None or hit[0] != stamp:
            try:
                hit = (stamp, self._generation, parse(Path(path_s)), None)
            except GpuwardenError as exc:
                hit = (stamp, self._generation, None, exc)
        elif hit[1] != self._generation:
            hit = (hit[0], self._generation, hit[2], hit[3])
        self._hits[key] = hit
        if hit[3] is not None:
            raise hit[3]
        return hit[2]

    def sweep(self, keep: frozenset[str] | set[str] = frozenset()) -> None:
        """Forget files not asked for since the last sweep (engines removed, logs rotated away), but those in
        `keep` (files a caller knows unchanged without asking, see engines.watch)."""
        gen = self._generation
        for key in [k for k, v in self._hits.items() if v[1] != gen and k[0] not in keep]:
            del self._hits[key]
        self._generation += 1

    def __len__(self) -> int:
        return len(self._hits)
