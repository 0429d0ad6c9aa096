"""The unit half of tests/integration/tui/test_tui_charts.py (its tests that need no process, socket or server); the pair's subject:
The GPU detail view's charts, the topology view, MI300 partitions in the GPUs panel, and the blast radius in
fix's confirmation (issue 24). Textual's Pilot on the simulated node (its hive and partition modes), with a real
agent for the seven-day trend.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from helpers.tui_app import live_app
from helpers.tui_support import fixed_snapshot, make_app, screen_text, wait_for

from helpers.tui_app import flat, node, open_charts

pytestmark = pytest.mark.timeout(120)

SIZES = [(80, 24), (200, 50)]
HIVE_REACH = "resetting GPU 2 also resets GPUs 0-1, 3 of hive 0x51510001"


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("size", SIZES)
def test_the_detail_view_charts_the_last_hour(state_dir, size):
    settings = node(state_dir)

    async def go():
        app = live_app(settings)
        async with app.run_test(size=size) as pilot:
            pane = await open_charts(app, pilot)
            # c scrolls the view down to the charts once they are drawn
            await wait_for(pilot, lambda: "-60" in screen_text(app), what="the first chart's axis on screen")
            text = screen_text(app)
            assert "VRAM GiB (used, residual), last hour" in text, text
            assert "-60" in text and "-30" in text  # the hour's axis
            assert "⢕⢕ used" in text and "⢕⢕ residual" in text  # the legend of both lines
            charts = {c.key: c.built.plain for c in pane.query("Chart")}
            assert "24┤" in charts["vram"] and "minutes ago" in charts["vram"]  # y axis: the GPU's 24 GiB
            for key, title in (("busy_percent", "busy %"), ("power_mw", "power W"), ("temperature_mc", "temperature C")):
                assert f"{title}, last hour" in charts[key] and "minutes ago" in charts[key], charts[key]
            assert "n/a: the 7-day trend is the agent's; no agent serves this node" in charts["week"]
            if size == (200, 50):  # two a row, everything on one screen
                assert "busy %, last hour" in text and "temperature C, last hour" in text
                assert "n/a: the 7-day trend is the agent's" in text
            else:  # one a row: the first chart fits under the summary, the rest scroll
                assert "24┤" in text
    run(go())


def test_a_reading_the_source_lacks_is_na_not_zero(settings):
    def source():
        snap = fixed_snapshot(taken_at=time.time())
        return replace(snap, gpus=tuple(replace(g, power_w=None, temperature_c=None) for g in snap.gpus))

    async def go():
        app = make_app(settings, source=source)
        async with app.run_test(size=(200, 50)) as pilot:
            pane = await open_charts(app, pilot)
            charts = {c.key: c.built.plain for c in pane.query("Chart")}
            assert "n/a: the sim backend gives no power reading for this GPU" in charts["power_mw"]
            assert "n/a: the sim backend gives no temperature reading for this GPU" in charts["temperature_mc"]
            assert "87.0┤" not in charts["busy_percent"] and "minutes ago" in charts["busy_percent"]
            assert "n/a: the sim backend gives no power" in screen_text(app)
    run(go())


@pytest.mark.parametrize("size", SIZES)
def test_the_topology_view_shows_hives_numa_and_each_blast_radius(state_dir, size):
    settings = node(state_dir, hive=True)

    async def go():
        app = live_app(settings)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            await pilot.press("x")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "TopologyScreen", what="the topology view")
            await wait_for(pilot, lambda: app.screen.computed >= 1, timeout=30, what="the topology read")
            await wait_for(pilot, lambda: "RESET REACHES" in screen_text(app), what="the topology drawn")
            text = screen_text(app)
            assert "XGMI hive 0x51510001, NUMA node 0" in text, text
            assert "RESET REACHES" in text and "0, 1, 2, 3     0x51510001  0" in text, text
            if size == (200, 50):
                assert "SPX/NPS1   0000:12:00.0" in text
                assert HIVE_REACH in text and "Blast radius of a reset" in text
            else:
                assert HIVE_REACH in flat(text) or "Blast radius" in text
    run(go())


def test_a_sim_reset_of_a_partition_clears_the_whole_device(state_dir):
    from gpuwarden.ops.node.sim.node import SimNode
    node(state_dir, partition="DPX")
    sim = SimNode(state_dir)
    for g in (1, 2, 3):
        sim.leak(g, 1 << 30)
    sim.reset(3)
    assert set(sim.describe()["leaked"]) == {1}  # GPUs 2 and 3 are one device; GPU 1 is the other's


def test_the_topology_of_a_node_read_over_ssh_reads_no_local_pci_tree(settings):
    def source():
        return replace(fixed_snapshot(taken_at=time.time()), source="ssh:gpu07")

    async def go():
        app = make_app(settings, source=source)
        async with app.run_test(size=(200, 50)) as pilot:
            await wait_for(pilot, lambda: app.snapshot is not None, timeout=30, what="first snapshot")
            await pilot.press("x")
            await wait_for(pilot, lambda: getattr(app.screen, "computed", 0) >= 1, timeout=30, what="the topology")
            await wait_for(pilot, lambda: "NUMA and PCIe n/a" in screen_text(app), what="the topology drawn")
            assert all(r["numa_node"] is None and r["pcie_parent"] is None for r in app.screen.doc["gpus"])
            assert "NUMA and PCIe n/a: node-a17 is read over SSH" in screen_text(app)
    run(go())
