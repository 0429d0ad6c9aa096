"""The live fleet with Prometheus first: Prometheus polled in a thread of its own, SSH streams (FleetMonitor) only
for the nodes whose series are missing or stale, and for the node open in the console.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

from gpuwarden.ops.fleet.inventory import Host
from gpuwarden.ops.fleet.monitor import FleetMonitor
from gpuwarden.ops.fleet.promapi import PrometheusError
from gpuwarden.ops.fleet.promfleet import PromReading, PromSettings, history, read_fleet, vram_history
from gpuwarden.ops.fleet.ssh import SshSettings
from gpuwarden.ops.fleet.summary import NodeHistory, NodeRow

HISTORY_EVERY_S = 30.0  # the trend column moves per step of the window; no need to ask every refresh


class PromFleetMonitor(FleetMonitor):
    def __init__(self, hosts: list[Host], ssh: SshSettings, command: Callable[..., str], prom: PromSettings, *,
                 interval: float = 1.0, parallel: int = 32, history_s: float | None = 3600.0):
        super().__init__(hosts, ssh, command, interval=interval, parallel=parallel, follow=())
        self.prom = prom
        self.history_s = history_s
        self.prom_error: str | None = None
        self._api = prom.api()
        self._reading: PromReading | None = None
        self._history: dict[str, NodeHistory] = {}
        self._pinned: str | None = None
        self._streamed: set[str] = set()
        self._steering = threading.Lock()  # the poller and the console (pin) both steer the streams
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="gpuwarden-fleet-prometheus", daemon=True)

    def start(self) -> "PromFleetMonitor":
        super().start()
        self._poller.start()
        return self

    def close(self) -> None:
        self._stop.set()
        super().close()
        if self._poller.is_alive():
            self._poller.join(self.prom.timeout_s * 4 + 1)

    def pin(self, name: str | None) -> None:
        with self._changed:
            self._pinned = name
        self._steer()

    # --- the poller thread ----------------------------------------------------------------------
    def _poll(self) -> None:
        asked = 0.0
        while not self._stop.is_set():
            reading, error, hist = None, None, None
            try:
                reading = read_fleet(self.prom, self.hosts, self._api)
                if self.history_s and time.monotonic() - asked >= HISTORY_EVERY_S:
                    hist, asked = history(self.prom, reading, self.history_s, self._api), time.monotonic()
            except PrometheusError as exc:
                error = exc.message
            with self._changed:
                self._reading, self.prom_error = reading, error
                if hist is not None:
                    self._history = hist
                self._changed.notify_all()
            self._steer()
            self._stop.wait(self.interval)

    def _steer(self) -> None:
        """Stream exactly the nodes Prometheus cannot vouch for, and the open one."""
        with self._changed:
            fresh = set(self._reading.rows) if self._reading is not None else set()
            want = {h.name for h in self.hosts if h.name not in fresh}
            if self._pinned:
                want.add(self._pinned)
        with self._steering:
            for name in want - self._streamed:
                self.follow(name)
            for name in self._streamed - want:
                self.unfollow(name)
            self._streamed = want

    # --- readers (any thread) -------------------------------------------------------------------
    def rows(self, stale_after: float | None = None) -> list[NodeRow]:
        over_ssh = {r.name: r for r in super().rows(stale_after)}
        with self._changed:
            reading, hist, error = self._reading, self._history, self.prom_error
        out = []
        for host in self.hosts:
            row = reading.rows.get(host.name) if reading is not None else None
            if row is None:
                note = "Prometheus did not answer" if reading is None else reading.missing.get(host.name)
                row = replace(over_ssh[host.name], note=note if (reading is not None or error) else None)
            out.append(replace(row, history=hist[host.name]) if host.name in hist else row)
        return out

    def vram_backfill(self, name: str, since: float, step: float) -> list[tuple[int, float, float]]:
        """(gpu, ts, used fraction) of node `name` from `since` until now, from Prometheus (blocking)."""
        with self._changed:
            exporter = self._reading.exporters.get(name) if self._reading is not None else None
        if exporter is None:
            return []
        try:
            return vram_history(self.prom, exporter, since, time.time(), step, self._api)
        except PrometheusError:
            return []
