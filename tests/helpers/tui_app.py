"""What several test files share with test_tui_app.py: live_app, sim_settings.

Taken out of test_tui_app.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

from pathlib import Path
from gpuwarden.ops.foundation.settings import Settings


def sim_settings(state_dir: Path, config: Path | None = None) -> Settings:
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(state_dir).init(gpus=4, vram=24 << 30)
    return Settings(state_dir=state_dir, backend="sim", config_path=config or state_dir / "node.toml")


def live_app(settings: Settings, **kw):
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.ops.sources import live_source
    source, close = live_source(settings)
    return GpuwardenApp(settings, source=source, on_exit=close, refresh_s=0.25, **kw)
