"""The prometheus_client collector: asks its source for the latest Reading at each scrape and builds the families
from it, and render() for the one-shot and textfile forms.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from .families import families
from .reading import MetricsOptions, Reading


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


def render(reading: Reading, options: MetricsOptions | None = None) -> bytes:
    """One exposition in Prometheus' text format (0.0.4)."""
    from prometheus_client.exposition import generate_latest
    return generate_latest(registry_for(SnapshotCollector(lambda: reading, options)))
