"""The agent's exporter: an observer of the Agent that counts the kernel-log findings its watch reports, turns
the agent's latest snapshot into a Reading at each scrape, and serves it on --metrics-listen (and the API socket).

Nothing is rendered between scrapes: the sampling thread only pays for on_event's counting.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any
from dataclasses import replace

from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.triage.patterns import RULES
from gpuwarden.ops.metrics.collector import SnapshotCollector
from gpuwarden.ops.metrics.exposition import Exposition
from gpuwarden.ops.metrics.plan import PlanCache
from gpuwarden.ops.metrics.reading import MetricsOptions, Reading
from gpuwarden.ops.services.metrics_server import Listener, TlsFiles

if TYPE_CHECKING:
    from gpuwarden.ops.services.agent_daemon import Agent

COUNTED_SEVERITIES = ("critical", "error", "warning")


def finding_keys() -> list[tuple[str, str]]:
    """(category, severity) of every triage rule the watch can report: exported at 0 from the start, so the
    first fault of a kind shows as an increase (a series born at 1 shows none)."""
    return sorted({(r.category, r.severity) for r in RULES if r.severity in COUNTED_SEVERITIES})


class MetricsExporter:
    def __init__(self, agent: "Agent", options: MetricsOptions | None = None, listen: str | None = None,
                 tls: TlsFiles | None = None):
        self.agent = agent
        self.options = options or MetricsOptions()
        self.plan = PlanCache(agent.settings)
        self._findings: dict[tuple[str, str], int] = dict.fromkeys(finding_keys(), 0)
        self._lock = threading.Lock()
        self.collector = SnapshotCollector(self.reading, self.options)
        self.exposition = Exposition()
        self.listener: Listener | None = None
        if listen:
            self.listener = Listener(listen, self.exposition.wsgi_app(self.collector.collect), tls)

    @property
    def scraped_per_process(self) -> bool:
        """A listener exports per-process series: its scraper reads per-process GPU% (the agent keeps it fresh)."""
        return self.listener is not None and self.options.per_process

    def start(self) -> str | None:
        """Bind the listener (before the agent starts, so a busy port fails the start); its URL, or None."""
        return self.listener.start() if self.listener is not None else None

    # --- agent hooks (keep them quick: they run in the agent's threads) -----------------------------------------
    def on_snapshot(self, snapshot: NodeSnapshot, events: list[dict[str, Any]]) -> None:
        pass  # a scrape reads agent.latest() itself

    def on_event(self, record: dict[str, Any]) -> None:
        if record.get("kind") != "kernel":
            return
        data = record.get("data") or {}
        key = (str(data.get("category") or "other"), str(data.get("severity") or "warning"))
        n = int(data.get("count") or 1) + int(data.get("repeats_since_last") or 0)
        with self._lock:
            self._findings[key] = self._findings.get(key, 0) + n

    def close(self) -> None:
        if self.listener is not None:
            self.listener.stop()

    # --- scrapes ------------------------------------------------------------------------------------------------
    def reading(self) -> Reading | None:
        latest = self.agent.latest()
        if latest is None:
            return None
        stale, age = self.agent.staleness()
        with self._lock:
            findings = dict(self._findings)
        return Reading(snapshot=latest.snapshot, mode="agent", stale=stale, age_s=age,
                       residual_since=dict(self.agent.changes.residual_since), findings=findings,
                       plan=self.plan.current(), now=time.time())

    def text(self, per_process: bool = False, hostname: bool = False) -> bytes:
        """One exposition in the text format (the API socket's /metrics), b"" before the first snapshot;
        per_process and hostname add to the agent's own options for this one."""
        if self.agent.latest() is None:
            return b""
        if per_process or self.options.per_process:
            self.agent.process_gpu_served()
        collector = self.collector
        if (per_process and not self.options.per_process) or (hostname and not self.options.hostname):
            options = replace(self.options, per_process=per_process or self.options.per_process,
                              hostname=self.options.hostname or (os.uname().nodename if hostname else None))
            collector = SnapshotCollector(self.reading, options)
            return Exposition().render(collector.collect)[0]  # a one-off: keep the listener's texts
        return self.exposition.render(collector.collect)[0]
