"""Every node action from the TUI's keys on the simulated node with real processes: purge a zombie holder,
drain, reset an ownerless leak, undrain, record the baseline, collect a bundle and read its triage.

The same playbook objects as the CLI run; the test checks the node afterwards, not only the events.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from helpers.simnode import cli_argv
from helpers.simnode import proc_state
from helpers.reaper_family import start_family
from helpers.simnode import wait_for as wait_until
from helpers.tui_app import live_app, sim_settings
from helpers.tui_support import screen_text, wait_for

from gpuwarden.ops.node import nodestate
from gpuwarden.ops.node.sim.node import SimNode
from helpers.tui_actions import select_gpu

pytestmark = pytest.mark.timeout(180)


async def run_action(app, pilot, key: str, *, confirm: bool, timeout: float = 60.0):
    """Press an action key, answer the dialog when one comes, wait for the run; returns its result."""
    before = app.current_run
    await pilot.press(key)
    await wait_for(pilot, lambda: app.current_run is not before, what=f"{key} to start")
    if confirm:
        await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "cancel", what="confirm dialog")
        await pilot.press("right", "enter")
    await wait_for(pilot, lambda: not app.current_run.running, timeout=timeout, what=f"{key} to finish")
    await pilot.press("escape")  # hide the progress view
    return app.current_run.result


def test_purge_drain_reset_undrain_baseline_bundle(state_dir):
    settings = sim_settings(state_dir)
    node = SimNode(state_dir)
    node.leak(0, 6 << 30)  # ownerless: only a reset clears it
    fam = start_family(cli_argv(state_dir, "sim", "hold", "--gpu", "1", "--size", "5GiB"))
    try:
        assert wait_until(lambda: any(p.name.startswith(f"{fam.tenant}-") for p in node.allocs_dir.glob("*.json")),
                          20)
        os.kill(fam.tenant, signal.SIGKILL)
        assert wait_until(lambda: proc_state(fam.tenant) == "Z", 5)

        async def go():
            app = live_app(settings)
            async with app.run_test(size=(120, 36)) as pilot:
                res = lambda g: next(r for r in app.snapshot.residual if r.gpu_index == g)  # noqa: E731
                await wait_for(pilot, lambda: app.snapshot is not None and res(1).holders, timeout=20,
                               what="the zombie holder on GPU 1")
                await wait_for(pilot, lambda: f"pid {fam.tenant} holds VRAM (zombie)" in screen_text(app)
                               or "residual VRAM 5.0 GiB appeared" in screen_text(app), what="residual event")

                await select_gpu(app, pilot, 1)
                result = await run_action(app, pilot, "P", confirm=True)
                assert result.ok, [e.to_dict() for e in result.events]
                await wait_for(pilot, lambda: not res(1).holders and not res(1).significant, timeout=15,
                               what="GPU 1 clean in the panel")
                assert proc_state(fam.tenant) is None

                # Drain a clean GPU (a leaking one would wait out the drain's idle timeout), then undrain it.
                await select_gpu(app, pilot, 2)
                result = await run_action(app, pilot, "d", confirm=True)
                assert result.ok, [e.to_dict() for e in result.events]
                assert 2 in nodestate.drained(state_dir)
                await wait_for(pilot, lambda: 2 in app.snapshot.drained, what="drained mark")
                assert "DRAINED" in screen_text(app)
                result = await run_action(app, pilot, "u", confirm=False)
                assert result.ok and 2 not in nodestate.drained(state_dir)

                # Reset refuses an undrained GPU, then clears the ownerless leak once GPU 0 is drained.
                await select_gpu(app, pilot, 0)
                result = await run_action(app, pilot, "R", confirm=False)
                assert not result.ok and "not drained" in (result.refused or "")
                nodestate.set_drained(state_dir, 0, True, who="test", reason="leak")
                assert res(0).significant  # the leak is still there
                result = await run_action(app, pilot, "R", confirm=True)
                assert result.ok, [e.to_dict() for e in result.events]
                await wait_for(pilot, lambda: not res(0).significant, timeout=15, what="the leak gone after reset")
                nodestate.set_drained(state_dir, 0, False)

                result = await run_action(app, pilot, "b", confirm=False)
                assert result.ok and set(nodestate.baseline(state_dir)) == {0, 1, 2, 3}

                result = await run_action(app, pilot, "B", confirm=False)
                assert result.ok
                assert app.last_bundle is not None and app.last_bundle.exists()
                await pilot.press("t")
                await wait_for(pilot, lambda: "triage of" in screen_text(app), what="triage view")
                await pilot.press("escape")
                await wait_for(pilot, lambda: "bundle: done" in screen_text(app), what="bundle line in Events")
        asyncio.run(go())
    finally:
        fam.stop()


def test_a_collected_bundle_opens_read_only_with_its_triage(state_dir, tmp_path):
    from gpuwarden.playbooks.bundle import BundlePlaybook
    from gpuwarden.playbooks.framework import run
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.ops.sources import bundle_source
    settings = sim_settings(state_dir)
    SimNode(state_dir).leak(3, 2 << 30)
    result = run(BundlePlaybook(output=tmp_path / "incident.tar.gz"), settings)
    assert result.ok
    bundle = tmp_path / "incident.tar.gz"

    async def go():
        app = GpuwardenApp(settings, source=bundle_source(bundle, settings), bundle=bundle)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            text = screen_text(app)
            assert "READ-ONLY" in text and f"replay {bundle.name}" in text and "SIMULATED" in text
            assert app.snapshot.source.startswith("bundle:")
            assert "STALE" not in text  # a replay is old by nature, not stale
            await pilot.press("d")
            await pilot.pause()  # the key handled: a replay starts nothing
            assert app.current_run is None
            await pilot.press("t")
            await wait_for(pilot, lambda: "triage of" in screen_text(app)
                           and "reading the bundle" not in screen_text(app), what="triage view")
            assert "no triage summary" not in screen_text(app)
    asyncio.run(go())


def test_command_palette_runs_an_action(state_dir):
    settings = sim_settings(state_dir)

    async def go():
        app = live_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None)
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "CommandPalette", what="the palette")
            await pilot.press(*"record idle")
            await wait_for(pilot, lambda: "Record idle baseline" in screen_text(app), what="palette hit")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.current_run is not None and not app.current_run.running,
                           timeout=30, what="baseline from the palette")
            assert app.current_run.playbook.name == "baseline" and app.current_run.result.ok
    asyncio.run(go())
    assert set(nodestate.baseline(state_dir)) == {0, 1, 2, 3}
