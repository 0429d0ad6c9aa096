"""Whether anything changed in a few directories since the last ask, from one inotify descriptor read without waiting.

A long-lived sampler asks it every refresh instead of stat-ing each state file; a backstop answers "changed" anyway.
"""

from __future__ import annotations

import os
import select
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from inotify_simple import INotify

BACKSTOP_S = 30.0


class DirWatch:
    """changed() is True at the first ask, after any event in a watched directory, and at least every backstop_s.

    The backstop covers what inotify cannot see: a write on another host to a network filesystem, a file a
    symlink elsewhere points to. A directory not there yet is watched through its deepest existing ancestor,
    and the watches are made again once anything on that way changes. Without inotify (its instance or watch
    limit reached) every ask is True: the caller reads its files as it would without a watch, and `unavailable`
    says why. Not thread-safe: one per sampler.
    """

    def __init__(self, dirs: Iterable[Path | str], *, backstop_s: float = BACKSTOP_S,
                 clock: Callable[[], float] = time.monotonic):
        self.dirs = tuple(dict.fromkeys(os.path.abspath(d) for d in dirs))
        self.backstop_s = backstop_s
        self.clock = clock
        self.unavailable: str | None = None
        self._inotify: INotify | None = None
        # Asked every refresh: poll(0) on the descriptor is the cheapest "anything queued?" (about half of a read
        # that fails with EAGAIN, cold; tests/bench/RESULTS.md, issue 38, seventh session).
        self._poll = select.poll()
        # Watch descriptors of ancestors standing in for a directory not there yet: an event there can be its coming.
        self._ancestors: set[int] = set()
        self._rearm = 0  # set by _arm from inotify's flags
        self._last_true: float | None = None
        self._armed_at = clock()
        self._arm()

    def changed(self) -> bool:
        now = self.clock()
        if self._inotify is None and now - self._armed_at >= self.backstop_s:
            self._armed_at = now  # a limit reached may have been freed since: try again, as seldom as the backstop
            self._arm()
        if self._inotify is None or self._last_true is None or now - self._last_true >= self.backstop_s:
            self._drain()
            self._last_true = now
            return True
        if not self._poll.poll(0) or not self._drain():
            return False
        self._last_true = now
        return True

    def close(self) -> None:
        if self._inotify is not None:
            self._poll.unregister(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None

    def _drain(self) -> bool:
        """Read every queued event; make the watches again when one says the way to a directory changed."""
        if self._inotify is None:
            return True
        try:
            events = self._inotify.read(timeout=0)
        except OSError as exc:
            self._give_up(f"inotify read failed: {exc}")
            return True
        if not events:
            return False
        rearm = self._rearm
        if any(e.mask & rearm or e.wd in self._ancestors for e in events):
            self.close()
            self._arm()
        return True

    def _arm(self) -> None:
        try:
            # deferred: the one-shot `status` never watches (its sampler refreshes once)
            from inotify_simple import INotify, flags
            inotify = INotify(nonblocking=True)
        except (ImportError, OSError) as exc:
            self._give_up(f"inotify unavailable: {exc}")
            return
        mask = (flags.CREATE | flags.DELETE | flags.MOVED_FROM | flags.MOVED_TO | flags.MODIFY | flags.CLOSE_WRITE
                | flags.ATTRIB | flags.DELETE_SELF | flags.MOVE_SELF)
        # events that say the way to a directory changed: its watch is gone or pointed elsewhere
        self._rearm = flags.IGNORED | flags.Q_OVERFLOW | flags.DELETE_SELF | flags.MOVE_SELF
        self._ancestors = set()
        try:
            for d in self.dirs:
                target = _deepest_existing(d)
                wd = inotify.add_watch(target, mask)
                if target != d:
                    self._ancestors.add(wd)
        except OSError as exc:
            inotify.close()
            self._give_up(f"inotify watch failed: {exc}")
            return
        self._inotify = inotify
        self._poll.register(inotify.fileno(), select.POLLIN)
        self.unavailable = None

    def _give_up(self, why: str) -> None:
        self.close()
        self.unavailable = f"{why} (state files are checked every refresh instead)"


def _deepest_existing(path: str) -> str:
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
