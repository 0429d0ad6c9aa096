"""Per-process GPU% is asked of the GPU source only while a view shows it (issue 38): the sampler skips NVML's
per-process utilisation when told, and the console tells it as its Processes panel or a detail screen comes and goes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.tui_support import wait_for

from gpuwarden.ops.foundation.settings import Settings


def sim_settings(state_dir: Path) -> Settings:
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(state_dir).init(gpus=2, vram=24 << 30)
    return Settings(state_dir=state_dir, backend="sim", config_path=state_dir / "node.toml")


def test_the_sampler_asks_per_process_utilisation_only_while_it_is_shown(tmp_path):
    from gpuwarden.ops.sampling.sampler import Sampler
    sampler = Sampler(sim_settings(tmp_path / "state"))
    asked = []
    sampler.backend.process_utilisation = lambda: asked.append(1) or {}  # type: ignore[attr-defined]
    try:
        sampler.snapshot()
        assert len(asked) == 1
        sampler.process_gpu = False
        sampler.snapshot()
        sampler.snapshot()
        assert len(asked) == 1
        sampler.process_gpu = True
        sampler.snapshot()
        assert len(asked) == 2
    finally:
        sampler.close()


def test_the_console_tells_its_source_when_processes_are_shown(tmp_path):
    from gpuwarden.ops.sources.kinds import LocalSource
    from gpuwarden.tui.app import GpuwardenApp
    settings = sim_settings(tmp_path / "state")
    source = LocalSource(settings, console=True)
    told: list[bool] = []
    real = source.show_process_gpu

    def tell(shown: bool) -> None:
        told.append(shown)
        real(shown)
    source.show_process_gpu = tell  # type: ignore[method-assign]

    async def go():
        app = GpuwardenApp(settings, source=source, on_exit=source.close, refresh_s=0.25)
        async with app.run_test(size=(160, 40)) as pilot:
            app.apply_layout("engines")  # Processes hidden
            await wait_for(pilot, lambda: told[-1:] == [False], what="per-process GPU% switched off")
            assert source.sampler.process_gpu is False
            app.apply_layout("processes")
            await wait_for(pilot, lambda: told[-1:] == [True], what="switched on with the Processes panel")
            assert source.sampler.process_gpu is True
            app.apply_layout("engines")
            await wait_for(pilot, lambda: told[-1:] == [False], what="off again")
            await pilot.press("question_mark")  # any screen over the main one (a detail view) shows it again
            await wait_for(pilot, lambda: told[-1:] == [True], what="on under a screen")
    asyncio.run(go())
