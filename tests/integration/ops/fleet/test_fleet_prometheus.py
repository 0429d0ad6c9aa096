"""`fleet status --prometheus`: a real Prometheus scraping two real agents (gpu01, gpu02 of the sshd fleet, each
under its own instance label); the other nodes, and any whose series go missing or stale, are read over SSH.
"""

from __future__ import annotations

import json

import pytest

from helpers.simnode import wait_for
from helpers.net import free_port
from helpers.fleet_ssh import fleet, rows
from helpers.metrics_e2e import Prom
from helpers.fleet_prometheus import start_exporting_agent

GiB = 1 << 30
pytestmark = pytest.mark.slow


@pytest.fixture
def prom_fleet(ssh_fleet, tmp_path):
    agents, targets = {}, {}
    try:
        for name in ("gpu01", "gpu02"):
            agents[name], targets[name] = start_exporting_agent(ssh_fleet.node(name))
        prom = Prom(tmp_path, targets)
        try:
            wait_for(lambda: prom.value('count(gpuwarden_agent_info{mode="agent"})') == 2, timeout=30,
                     what="both agents scraped", poll=0.2)
            yield ssh_fleet, prom, agents
        finally:
            prom.stop()
    finally:
        for agent in agents.values():
            agent.stop()


def test_rows_from_prometheus_fall_back_to_ssh_per_node(prom_fleet):
    ssh_fleet, prom, agents = prom_fleet
    # gpu02's leak is three scrapes old before the history is asked for.
    wait_for(lambda: (prom.value('count_over_time(gpuwarden_gpu_residual_significant{instance="gpu02",gpu="1"}[1m])')
                      or 0) >= 3, timeout=30, what="gpu02's residual in three scrapes", poll=0.2)
    proc = fleet(ssh_fleet, "status", "--prometheus", prom.url, "--nodelist", "gpu[01-03],gpu09", "--json",
                 "--history", "5m", "--timeout", "20")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    nodes = rows(proc)
    assert doc["sources"] == {"prometheus": 2, "ssh": 1, "unreachable": 1}
    assert doc["prometheus"]["url"] == prom.url and doc["prometheus"]["error"] is None
    g1, g2, g3, g9 = (nodes[n] for n in ("gpu01", "gpu02", "gpu03", "gpu09"))
    assert g1["source"] == "prometheus" and g1["state"] == "ok" and g1["agent"] is True
    assert g1["gpus"] == 2 and g1["backend"] == "sim" and g1["simulated"] is True and g1["source_note"] is None
    assert g2["source"] == "prometheus" and g2["state"] == "attention"
    assert g2["residual_gpus"] == [1] and g2["residual_bytes"] == 3 * GiB
    assert g2["history"]["residual_max_bytes"] == 3 * GiB and g2["history"]["crashes"] == 0
    assert g3["source"] == "ssh" and g3["source_note"] == "not in Prometheus" and g3["engines"]["crashed"] == 1
    assert g3["history"] is None
    assert g9["source"] == "unreachable" and g9["source_note"] == "not in Prometheus"

    # The table says it too, and why two nodes were asked over SSH.
    text = fleet(ssh_fleet, "status", "--prometheus", prom.url, "--nodelist", "gpu[01-03]", "--timeout", "20")
    lines = text.stdout.splitlines()
    assert lines[0].split()[-1] == "SOURCE"
    assert {line.split()[0]: line.split()[-1] for line in lines[1:4]} == \
        {"gpu01": "prometheus", "gpu02": "prometheus", "gpu03": "ssh"}
    assert "over SSH (not in Prometheus): gpu03" in text.stdout

    # No inventory: the fleet is every node Prometheus has gpuwarden series of.
    found = fleet(ssh_fleet, "status", "--prometheus", prom.url, "--json")
    assert sorted(rows(found)) == ["gpu01", "gpu02"], found.stdout + found.stderr

    # Series older than --prometheus-max-age: that node is asked over SSH, where its agent answers.
    old = rows(fleet(ssh_fleet, "status", "--prometheus", prom.url, "--prometheus-max-age", "0.001",
                     "--nodelist", "gpu01", "--json"))["gpu01"]
    assert old["source"] == "ssh" and old["source_note"] == "its series are older than 0.001s"
    assert old["agent"] is True  # status over SSH went through the node's agent

    # gpu01's agent stops: its scrape fails, its series go stale, it is read over SSH (no agent answers there).
    agents["gpu01"].stop()
    wait_for(lambda: prom.value('up{instance="gpu01"}') == 0, timeout=30, what="gpu01's scrape failing", poll=0.2)
    down = rows(fleet(ssh_fleet, "status", "--prometheus", prom.url, "--nodelist", "gpu01,gpu02", "--json"))
    assert down["gpu01"]["source"] == "ssh" and down["gpu01"]["agent"] is False
    assert down["gpu01"]["source_note"] == "not in Prometheus: its scrape fails (up=0)"
    assert down["gpu02"]["source"] == "prometheus"


def test_prometheus_that_does_not_answer_means_ssh_for_every_node(ssh_fleet):
    url = f"http://127.0.0.1:{free_port()}"
    proc = fleet(ssh_fleet, "status", "--prometheus", url, "--nodelist", "gpu01", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["prometheus"]["error"].startswith(f"prometheus at {url} did not answer")
    assert rows(proc)["gpu01"]["source"] == "ssh" and rows(proc)["gpu01"]["source_note"] == "Prometheus did not answer"
    text = fleet(ssh_fleet, "status", "--prometheus", url, "--nodelist", "gpu01")
    assert "gpuwarden: warning: prometheus at" in text.stderr and "every node read over SSH" in text.stderr
    none = fleet(ssh_fleet, "status", "--prometheus", url)  # and no inventory: nothing to fall back to
    assert none.returncode == 2 and "gpuwarden: error: no nodes: prometheus at" in none.stderr
    bad = fleet(ssh_fleet, "status", "--prometheus", "prom:9090", "--nodelist", "gpu01")
    assert bad.returncode == 2 and "is not an http(s) URL" in bad.stderr and "Traceback" not in bad.stderr


async def test_fleet_console_reads_prometheus_and_streams_only_the_rest(prom_fleet, tmp_path, monkeypatch):
    from gpuwarden.ops.fleet.promfleet import PromSettings
    from gpuwarden.ops.fleet.promwatch import PromFleetMonitor
    from gpuwarden.ops.foundation.settings import Settings
    from helpers.fleet_tui import fleet_target, until
    from gpuwarden.tui.fleet.app import FleetApp
    from gpuwarden.tui.fleet.screen import FleetScreen

    ssh_fleet, prom, _ = prom_fleet
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    target = fleet_target(ssh_fleet, "gpu[01-03]")
    monitor = PromFleetMonitor(list(target.hosts), target.ssh, target.remote, PromSettings(prom.url),
                               interval=0.5, history_s=300)
    backfilled = []
    ask = monitor.vram_backfill
    monkeypatch.setattr(monitor, "vram_backfill", lambda *a: backfilled.append(ask(*a)) or backfilled[-1])
    app = FleetApp(Settings(state_dir=tmp_path / "local"), monitor.start(), target, refresh_s=0.5)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            screen = await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen, what="fleet screen")

            def sources():
                got = {r.name: r.source for r in screen.shown}
                return got if got == {"gpu01": "prometheus", "gpu02": "prometheus", "gpu03": "ssh"} else None
            await until(pilot, sources, what="two nodes from Prometheus, gpu03 over SSH")
            assert monitor.feeds["gpu03"].connected and not monitor.feeds["gpu01"].connected
            gpu02 = next(r for r in screen.shown if r.name == "gpu02")
            assert gpu02.residual_gpus == (1,) and gpu02.history is not None
            assert "over SSH (not in Prometheus): gpu03" in str(screen.query_one("#fleet-reasons").render())

            table = screen.query_one("#fleet-table")
            table.cursor_row = [k for k, _ in table.rows].index("gpu02")
            await pilot.press("enter")  # its console needs the full snapshot: gpu02 is streamed over SSH now
            await until(pilot, lambda: app.snapshot is not None and app.snapshot.source == "ssh:gpu02",
                        what="gpu02's console over SSH")
            assert app.snapshot.agent is not None  # the node's `status --watch --json` streams its agent's snapshots
            await until(pilot, lambda: backfilled, what="the sparklines' minutes asked of Prometheus")
            assert {gpu for gpu, _, _ in backfilled[0]} == {0, 1}
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, FleetScreen), what="back to the fleet")
            await until(pilot, lambda: not monitor.feeds["gpu02"].connected or None, what="gpu02's stream closed")
    finally:
        monitor.close()
