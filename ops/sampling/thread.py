"""The thread that keeps sampling, so a hung backend call never blocks a screen, an API or a signal handler.

One daemon thread per owner (TUI, agent): take a snapshot, hand it over, wait the interval, repeat — never
two calls at once. A call in flight is visible (busy_since), so the owner can say how stale its data is.
"""

from __future__ import annotations

import _thread
import threading
import time
from typing import Callable

from gpuwarden.ops.config.keys import MIN_REFRESH_S
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import NodeSnapshot

SnapshotSource = Callable[[], NodeSnapshot]

# MIN_REFRESH_S: one floor for every sampler (the console, the agent, status --watch), declared with the keys.


class SamplingThread:
    """Calls `source` every `interval` seconds (counted from the end of the previous call) in a daemon thread.

    `deliver(snapshot)` and `failed(message)` are called from this thread and must be thread-safe
    (Textual's post_message is). A call that hangs delays the next one; it is never overlapped.
    """

    def __init__(self, source: SnapshotSource, interval: float, deliver: Callable[[NodeSnapshot], None],
                 failed: Callable[[str], None], close: Callable[[], None] | None = None,
                 min_interval: float = MIN_REFRESH_S, name: str = "gpuwarden-sampler"):
        self.source = source
        self.close = close  # called by this thread when it ends: never while a call is in flight
        self.interval = max(interval, min_interval)
        self.deliver = deliver
        self.failed = failed
        self._stop = threading.Event()
        # Held while no wake is pending; released to cut a wait short. A raw lock, not an Event: the wait is
        # the one thing this thread does every interval, and Event.wait's Condition costs about 30 us of CPU more
        # each time, cold (tests/bench/RESULTS.md, issue 38, seventh session).
        self._wake = _thread.allocate_lock()
        self._wake.acquire()
        self.busy_since: float | None = None  # monotonic start of the call in progress
        self.calls = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake_up()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; False when it is still in a call after `timeout`."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def refresh_now(self) -> None:
        """Cut the current wait short (after a playbook, or on the operator's request)."""
        self._wake_up()

    def _wake_up(self) -> None:
        try:
            self._wake.release()
        except RuntimeError:  # a wake is pending already: the next wait returns at once either way
            pass

    def busy_for(self) -> float | None:
        """Seconds the call in progress has been running, or None between calls."""
        since = self.busy_since
        return None if since is None else time.monotonic() - since

    def _loop(self) -> None:
        try:
            self._sample_until_stopped()
        finally:
            if self.close is not None:
                self.close()

    def _sample_until_stopped(self) -> None:
        while not self._stop.is_set():
            self.busy_since = time.monotonic()
            try:
                snap = self.source()
            except GpuwardenError as exc:
                snap = None
                message = exc.message + (f" ({exc.hint})" if exc.hint else "")
            except Exception as exc:  # a backend bug must show, not kill the sampling
                snap = None
                message = f"{type(exc).__name__}: {exc}"
            finally:
                self.busy_since = None
                self.calls += 1
            if self._stop.is_set():
                return
            if snap is not None:
                self.deliver(snap)
            else:
                self.failed(message)
            self._wake.acquire(timeout=self.interval)  # a wake that came meanwhile is taken here, as Event.clear did
