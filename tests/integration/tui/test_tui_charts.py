"""The GPU detail view's charts, the topology view, MI300 partitions in the GPUs panel, and the blast radius in
fix's confirmation (issue 24). Textual's Pilot on the simulated node (its hive and partition modes), with a real
agent for the seven-day trend.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers.tui_app import live_app
from helpers.tui_support import make_app, palette_choose, screen_text, wait_for

from helpers.tui_app import flat, node, open_charts

pytestmark = pytest.mark.timeout(120)

# The tests make their own sim node (hive, partitions): conftest's sim_cli initialises none.
SIM_NODE = None
HIVE_REACH = "resetting GPU 2 also resets GPUs 0-1, 3 of hive 0x51510001"


def run(coro):
    return asyncio.run(coro)


def test_the_seven_day_trend_and_older_points_come_from_the_agent(state_dir):
    from helpers.agentnode import start_agent
    from helpers.simnode import wait_for as wait_until
    from gpuwarden.ops.sources.choose import CONSOLE, choose
    from gpuwarden.tui.app import GpuwardenApp
    settings = node(state_dir, gpus=2)
    # Three days of minute trend, as an agent that ran before writes it (used avg, used max, residual max,
    # holders max, fragmentation per mille): GPU 0 at 6 GiB, with a 2 GiB residual on the last day.
    trend = state_dir / "agent" / "trend.jsonl"
    trend.parent.mkdir(mode=0o750)
    now = time.time() // 60 * 60
    trend.write_text("".join(json.dumps({"t": now - k * 1800, "gpus": {"0": [6 << 30, 7 << 30,
                                                                          (2 << 30) if k < 48 else 0, 0, -1]}}) + "\n"
                             for k in range(144, 0, -1)))
    agent = start_agent(state_dir)
    try:
        # The agent's history starts before the console: its points are older than the console's first.
        wait_until(lambda: len((agent.json("/v1/history?gpu=0&resolution=fine")["gpus"].get("0", {}).get("fine")
                                or {}).get("t", [])) >= 3, 30, "the agent's first samples")
        source = choose(settings, CONSOLE)
        close = source.close

        async def go():
            app = GpuwardenApp(settings, source=source, on_exit=close, refresh_s=0.25)
            async with app.run_test(size=(200, 50)) as pilot:
                pane = await open_charts(app, pilot)
                await wait_for(pilot, lambda: "days ago" in pane.query_one("#chart-week").built.plain, timeout=30,
                               what="the 7-day trend drawn")
                week = pane.query_one("#chart-week").built.plain
                assert "VRAM GiB, last 7 days (agent's minute trend)" in week and "used avg" in week, week
                assert "residual peak" in week and "24┤" in week
                assert pane._agent_fine and pane._agent_fine["points"] >= 3  # the agent's last hour, asked once
                assert "n/a" not in pane.query_one("#chart-busy_percent").built.plain
        run(go())
    finally:
        agent.stop()


def test_colon_reaches_the_topology_view(settings):
    async def go():
        app = make_app(settings)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            await palette_choose(app, pilot, "go to topology", "Go to topology")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "TopologyScreen", what="the topology view")
            await wait_for(pilot, lambda: app.screen.computed >= 1, timeout=30, what="the topology read")
            assert "Topology of node-a17: 4 GPU(s), no XGMI hive" in screen_text(app)
    run(go())


def test_fix_in_the_console_confirms_with_the_blast_radius(state_dir):
    from gpuwarden.ops.node.sim.node import SimNode
    settings = node(state_dir, hive=True)
    SimNode(state_dir).leak(2, 2 << 30)

    async def go():
        app = live_app(settings)
        async with app.run_test(size=(200, 50)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            app.query_one("#gpus").focus()
            await pilot.press("down", "down", "f")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", timeout=30,
                           what="the confirm dialog")
            await wait_for(pilot, lambda: "If a reset is needed" in flat(screen_text(app)), what="the question drawn")
            assert f"If a reset is needed, {HIVE_REACH}." in app.screen.question and app.screen.question.endswith("Proceed?")
            text = flat(screen_text(app))
            assert f"If a reset is needed, {HIVE_REACH}." in text, text
            assert f"({HIVE_REACH}) (only if needed)" in text  # the reset step of the plan says it too
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.current_run.result is not None, timeout=30, what="the cancelled run")
            assert app.current_run.result.refused == "cancelled"
    run(go())


def test_partitions_are_grouped_under_their_device_and_a_reset_says_it_takes_the_device(state_dir):
    from gpuwarden.ops.node.sim.node import SimNode
    settings = node(state_dir, partition="DPX")
    SimNode(state_dir).leak(2, 3 << 30)

    async def go():
        app = live_app(settings)
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            panel = app.query_one("#gpus")
            await wait_for(pilot, lambda: len(panel.rows) == 6, what="4 partitions under 2 device rows")
            assert [k for k, _ in panel.rows] == ["dev:0000:10:00.0", "0", "1", "dev:0000:11:00.0", "2", "3"]
            await wait_for(pilot, lambda: "reset: all 2" in screen_text(app), what="the device rows drawn")
            text = screen_text(app)
            assert "0000:11:00.0 DPX/NPS1" in text and "2 partitions" in text and "reset: all 2" in text
            assert "└ DPX 1" in text
            lines = {line.split()[1]: line for line in text.splitlines()
                     if len(line.split()) > 1 and line.split()[0] == "│" and line.split()[1] in "0123"}
            assert "3.0 GiB" in lines["2"] and "3.0 GiB" not in lines["3"], lines  # residual per partition
            assert "1 of 2" in next(line for line in text.splitlines() if "0000:11:00.0 DPX" in line)
            panel.cursor_row = 4  # GPU 2, a partition of device 0000:11:00.0
            await pilot.press("f")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", timeout=30,
                           what="the confirm dialog")
            reach = "resetting GPU 2 resets its physical device 0000:11:00.0, so also GPU 3 (DPX of the same device)"
            assert reach in app.screen.question
            # The dialog is up before its plan is drawn: wait for the line rather than read the screen once.
            await wait_for(pilot, lambda: "mark GPU 2, 3 drained" in flat(screen_text(app)), timeout=30,
                           what="the plan's mark step for both partitions")
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.current_run.result is not None, timeout=30, what="the cancelled run")
    run(go())


def test_sim_partitions_share_their_device_and_fix_plans_for_the_whole_device(sim_cli):
    bad = sim_cli("sim", "init", "--gpus", "3", "--partition", "dpx")
    assert bad.returncode == 2 and "cannot cut 3 simulated GPU(s) into DPX partitions" in bad.stderr, bad.stderr
    sim_cli("sim", "init", "--gpus", "8", "--partition", "cpx", check=True)
    topo = sim_cli("status", "--topology")
    assert topo.returncode == 0, topo.stderr
    assert "CPX/NPS4" in topo.stdout
    assert "resetting GPU 0 resets its physical device 0000:10:00.0, so also GPUs 1-7 (CPX of the same device)" \
        in topo.stdout
    sim_cli("sim", "leak", "--gpu", "5", "--size", "1GiB", check=True)
    plan = sim_cli("fix", "5", "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "GPU 5 is a partition of physical device 0000:10:00.0 with GPU 0, 1, 2, 3, 4, 6, 7" in plan.stdout
    assert "mark GPU 5, 0, 1, 2, 3, 4, 6, 7 drained" in plan.stdout


def test_the_charting_library_loads_with_the_chart_view_only():
    import subprocess
    import sys
    # Loaded when the GPU view composes its charts: not by the app, nor by importing the view's module.
    probe = ("import sys, gpuwarden.tui.app; a = any(m.split('.')[0] in ('textual_plotext', 'plotext') for m in "
             "sys.modules); from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen; "
             "b = 'textual_plotext' in sys.modules; w = GpuDetailScreen(0, None)._charts_or_why(); "
             "print(a, b, 'textual_plotext' in sys.modules, type(w).__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False", "True", "ChartsPane"], out.stdout + out.stderr
