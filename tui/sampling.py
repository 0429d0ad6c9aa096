"""Where snapshots come from and the thread that fetches them, so a hung backend never blocks the keys.

One daemon thread per app: take a snapshot, hand it over, wait the interval, repeat — never two at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from ops.errors import GpuwardenError
from ops.model import NodeSnapshot
from ops.settings import Settings

SnapshotSource = Callable[[], NodeSnapshot]

MIN_REFRESH_S = 0.25


def live_source(settings: Settings) -> tuple[SnapshotSource, Callable[[], None]]:
    """The live node through a Sampler (opened here, so a missing GPU library fails before the screen)."""
    from ops.snapshot import Sampler
    sampler = Sampler(settings)
    return sampler.snapshot, sampler.close


def bundle_source(path: Path, settings: Settings) -> SnapshotSource:
    """A captured node from an incident bundle; the same snapshot every time."""
    from ops.bundle.replay import snapshot_from_bundle
    snap = snapshot_from_bundle(path, settings)
    return lambda: snap


class SamplingThread:
    """Calls `source` every `interval` seconds (counted from the end of the previous call) in a daemon thread.

    `deliver(snapshot)` and `failed(message)` are called from this thread and must be thread-safe
    (Textual's post_message is). A call that hangs delays the next one; it is never overlapped.
    """

    def __init__(self, source: SnapshotSource, interval: float, deliver: Callable[[NodeSnapshot], None],
                 failed: Callable[[str], None], close: Callable[[], None] | None = None):
        self.source = source
        self.close = close  # called by this thread when it ends: never while a call is in flight
        self.interval = max(interval, MIN_REFRESH_S)
        self.deliver = deliver
        self.failed = failed
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.busy_since: float | None = None  # monotonic start of the call in progress
        self.calls = 0
        self._thread = threading.Thread(target=self._loop, name="gpuwarden-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def refresh_now(self) -> None:
        """Cut the current wait short (after a playbook, or on the operator's request)."""
        self._wake.set()

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
            except Exception as exc:  # a backend bug must show on screen, not kill the sampling
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
            self._wake.wait(self.interval)
            self._wake.clear()
