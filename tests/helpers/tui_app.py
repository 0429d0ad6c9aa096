"""What several test files share with test_tui_app.py (live_app, sim_settings) and with test_tui_charts.py (node,
flat, open_charts: both tiers' chart tests use them).

Taken out of test_tui_app.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

from pathlib import Path
from gpuwarden.ops.foundation.settings import Settings
from helpers.tui_support import wait_for


def sim_settings(state_dir: Path, config: Path | None = None) -> Settings:
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(state_dir).init(gpus=4, vram=24 << 30)
    return Settings(state_dir=state_dir, backend="sim", config_path=config or state_dir / "node.toml")


def live_app(settings: Settings, **kw):
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.ops.sources.kinds import LocalSource
    source = LocalSource(settings, console=True)  # the console's node, no agent asked
    close = source.close
    return GpuwardenApp(settings, source=source, on_exit=close, refresh_s=0.25, **kw)


def node(state_dir, **kw) -> Settings:
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(state_dir).init(**{"gpus": 4, "vram": 24 << 30, **kw})
    return Settings(state_dir=state_dir, backend="sim", config_path=state_dir / "node.toml")


def flat(text: str) -> str:
    """Screen text as one line of words: wrapped dialog lines joined, borders dropped."""
    return " ".join(text.translate({ord(c): " " for c in "│█▆▇▁▔▄▀"}).split())


async def open_charts(app, pilot, drawn: int = 2):
    await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
    await wait_for(pilot, lambda: app.chart_history.gpus(), timeout=30, what="the chart history's first sample")
    await pilot.press("c")
    await wait_for(pilot, lambda: type(app.screen).__name__ == "GpuDetailScreen", what="the GPU detail view")
    pane = app.screen.query_one("#charts")
    await wait_for(pilot, lambda: pane.builds >= drawn and pane.settled(), timeout=30, what="the charts drawn")
    await pilot.pause()  # the drawn figures reach the screen with the messages already queued
    return pane
