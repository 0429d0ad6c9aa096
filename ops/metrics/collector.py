"""The prometheus_client collector: asks its source for the latest Reading at each scrape and builds the families
from it; render() formats one Reading (the one-shot and textfile forms).
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from gpuwarden.ops.metrics.families import families
from gpuwarden.ops.metrics.reading import MetricsOptions, Reading
from gpuwarden.ops.metrics.exposition import Exposition


class SnapshotCollector:
    """Rebuilds every family from `source()` on each collect(); None from the source exports nothing."""

    def __init__(self, source: Callable[[], Reading | None], options: MetricsOptions | None = None):
        self.source = source
        self.options = options or MetricsOptions()

    def describe(self) -> list[Metric]:
        return []  # registering must not take a snapshot; the families change with the node anyway

    def collect(self) -> Iterator[Metric]:
        reading = self.source()
        if reading is None:
            return iter(())
        return iter(families(reading, self.options))


def registry_for(collector: SnapshotCollector) -> CollectorRegistry:
    """A registry with only our collector: no process or platform collectors of the exporter's own Python."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(reading: Reading, options: MetricsOptions | None = None, accept: str | None = None) -> bytes:
    """One exposition, in Prometheus' text format unless `accept` asks for OpenMetrics."""
    return Exposition().render(SnapshotCollector(lambda: reading, options).collect, accept)[0]
