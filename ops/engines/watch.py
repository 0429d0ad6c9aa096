"""The engine list refresh after refresh: the last list again while nothing it was made of changed.

What it is made of: the engines directory (a record added or removed moves its mtime), each engine's
state.json, spec.json and engine.log (mtime, size, inode) and each supervising shim's life (a pidfd each).
"""

from __future__ import annotations

import os

from gpuwarden.ops.engines import state
from gpuwarden.ops.foundation import pidwatch
from gpuwarden.ops.foundation.settings import Settings

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` samples through here
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.ops.foundation.filecache import FileCache
    from gpuwarden.ops.foundation.model import EngineInfo

_FILES = (state.STATE, state.SPEC, state.LOG)


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class EngineWatch:
    """list_engines(), the very same tuple again while its inputs stand. Not thread-safe: one per sampler.

    Why this is exact, not a guess: an EngineInfo is made from the two records, the log's last line and whether
    the shim lives (engines.state.info_from). The files are stat'ed every refresh (96 stats for 32 engines,
    against their checked reads and the path work around them: 1.8 -> ~0.3 ms on the big sim node); a shim
    is watched through a pidfd, which reads ready once it exits (zombie or reaped), so a shim's death is seen
    at the next refresh as a /proc read would. Where pidfds do not work (a captured /proc, another PID
    namespace, an old kernel) every refresh lists the engines in full, as before."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = str(state.engines_root(settings.state_dir))
        self._pids = pidwatch.PidWatch() if pidwatch.usable(settings.proc_root) else None
        self._last: tuple[EngineInfo, ...] | None = None
        self._made_of: list[tuple[str, tuple[int, int, int] | None]] = []
        self._files: frozenset[str] = frozenset()

    def engines(self, cache: FileCache, memo: dict[str, Any]) -> tuple[EngineInfo, ...]:
        """The engine list (list_engines through `cache` and `memo`); the last one while nothing changed."""
        last = self._last
        if last is not None and self._unchanged():
            return last
        self._last = None
        # Stamps taken before the reads: a change during them shows at the next refresh.
        made_of = [(self.root, _stamp(self.root))]
        try:
            entries = [n for n in os.listdir(self.root) if not n.startswith(".")]
        except OSError:
            entries = []
        made_of.extend((p, _stamp(p)) for n in entries for p in (f"{self.root}/{n}/{f}" for f in _FILES))
        listed = tuple(state.list_engines(self.settings, cache, memo))
        if self._watch_shims(memo):
            self._made_of = made_of
            self._files = frozenset(p for p, _ in made_of[1:])
            self._last = listed
        return listed

    def files(self) -> frozenset[str]:
        """The files the last list was made of, for the FileCache to keep while they are not read again."""
        return self._files if self._last is not None else frozenset()

    def _unchanged(self) -> bool:
        pids = self._pids
        if pids is None or pids.exited():
            return False
        return all(_stamp(p) == was for p, was in self._made_of)

    def _watch_shims(self, memo: dict[str, Any]) -> bool:
        """Watch the shim of every engine whose record says it is supervised and whose shim lives (list_engines'
        memo holds each engine's record and EngineInfo); False where one cannot be watched."""
        pids = self._pids
        if pids is None:
            return False
        wanted: dict[int, int] = {}
        for made_of, info in memo.values():
            record = made_of[0]
            if record is not None and not info.stale and info.phase not in state.FINAL_PHASES and info.shim_pid:
                wanted[info.shim_pid] = record.get("shim_start")
        for gone in pids.pids() - wanted.keys():
            pids.forget(gone)
        proc_root = self.settings.proc_root
        for pid, start in wanted.items():
            if pid in pids:
                continue
            # The pidfd first, then the check that it names the recorded shim: a shim that exited before the
            # pidfd was opened (its PID perhaps reused) fails the check, and one that exits after shows in it.
            if not pids.track(pid):
                return False
            if not state.alive(pid, start, proc_root):
                pids.forget(pid)
                return False
        return not pids.exited()

    def close(self) -> None:
        if self._pids is not None:
            self._pids.close()
        self._last = None
