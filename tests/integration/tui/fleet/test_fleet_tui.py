"""The fleet console against real sshd nodes: Pilot (rows worst first, filter, open a node, keys act on it
remotely with the confirm dialog) and the installed program in tmux."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from helpers.sshfleet import client_env, node_cli
from helpers.tui_terminal import Tmux

from helpers.journal import read_journal
from gpuwarden.ops.foundation.settings import Settings
from helpers.fleet_tui import fleet_target, until

pytestmark = pytest.mark.timeout(180)


def drained(node) -> list[int]:
    return json.loads(node_cli(node, "status", "--json", check=False).stdout)["drained"]


@pytest.mark.slow
async def test_fleet_console_rows_filter_open_node_and_remote_keys(ssh_fleet, tmp_path, monkeypatch):
    from gpuwarden.ops.fleet.monitor import FleetMonitor
    from gpuwarden.tui.fleet.app import FleetApp
    from gpuwarden.tui.fleet.screen import FleetScreen, FleetTable
    from gpuwarden.tui.widgets.gpus import GpusPanel

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no operator fleet config leaks in
    target = fleet_target(ssh_fleet, "gpu[01-04],gpu09")
    monitor = FleetMonitor(list(target.hosts), target.ssh, target.remote, interval=0.5).start()
    app = FleetApp(Settings(state_dir=tmp_path / "local"), monitor, target, refresh_s=0.5)
    try:
        async with app.run_test(size=(150, 40)) as pilot:
            screen = await until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen, what="fleet screen")
            table = screen.query_one(FleetTable)

            def settled():
                states = {r.name: r.state for r in screen.shown}
                return states if states.get("gpu02") == "attention" and states.get("gpu03") == "attention" \
                    and states.get("gpu01") == "ok" and "HOST KEY" in str([r.reason for r in screen.shown]) else None
            await until(pilot, settled, what="every node's first answer")
            order = [key for key, _ in table.rows]
            assert set(order[:2]) == {"gpu04", "gpu09"} and order[-1] == "gpu01", order  # worst first

            await pilot.press("slash", *"attention", "enter")
            await until(pilot, lambda: [k for k, _ in table.rows] == ["gpu02", "gpu03"] or None, what="filter")
            await pilot.press("escape")
            await until(pilot, lambda: len(table.rows) == 5 or None, what="filter cleared")

            table.cursor_row = [k for k, _ in table.rows].index("gpu02")
            await pilot.press("enter")
            await until(pilot, lambda: app.snapshot is not None and app.snapshot.hostname.startswith("gpu02"),
                        what="gpu02's console")
            assert not isinstance(app.screen, FleetScreen)
            assert app.snapshot.source == "ssh:gpu02" and app.snapshot.residual[1].residual == 3 * 2**30

            gpus = app.query_one(GpusPanel)
            gpus.focus()  # GPU 0: GPU 1 holds a leak that no drain can wait out
            await until(pilot, lambda: gpus.selected_gpu() == 0, what="GPU 0 selected")
            node = ssh_fleet.node("gpu02")
            await pilot.press("d")  # destructive: the dialog asks, Cancel has the focus
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="confirm dialog")
            await pilot.press("enter")
            await until(pilot, lambda: app.current_run and not app.current_run.running, what="cancelled run")
            assert app.current_run.result.refused == "cancelled" and drained(node) == []
            await pilot.press("escape")  # close the progress view

            await pilot.press("d")
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="confirm dialog")
            await pilot.press("right", "enter")  # Proceed
            await until(pilot, lambda: app.current_run and not app.current_run.running, timeout=60, what="drain")
            assert app.current_run.result.ok, [e.message for e in app.current_run.events]
            assert drained(node) == [0]
            entry = read_journal(node.state_dir)[-1]
            assert entry["via"] == "fleet"
            await until(pilot, lambda: app.snapshot and app.snapshot.drained == (0,), what="drain seen in console")

            await pilot.press("escape")
            await pilot.press("u")  # undrain asks nothing
            await until(pilot, lambda: app.current_run and not app.current_run.running
                        and app.current_run.playbook.name == "undrain", timeout=60, what="undrain")
            assert drained(node) == []

            await pilot.press("escape", "escape")
            await until(pilot, lambda: isinstance(app.screen, FleetScreen), what="back to the fleet")
    finally:
        monitor.close()
        if drained(ssh_fleet.node("gpu02")):
            node_cli(ssh_fleet.node("gpu02"), "undrain", "0")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (tests/run-all.sh installs it)")
def test_fleet_tui_in_a_real_terminal(ssh_fleet, tmp_path):
    tmux = Tmux(tmp_path / "tmux.sock")
    gpuwarden = Path(sys.executable).parent / "gpuwarden"
    try:
        tmux.start(f"{gpuwarden} --state-dir {tmp_path / 'local'} fleet tui --nodelist 'gpu0[1-3],gpu09' "
                   f"--read-only", width=80, height=24, env={**client_env(ssh_fleet), "COLUMNS": "80", "LINES": "24"})
        screen = tmux.wait_screen("ATTENTION")
        tmux.wait_screen("gpu09: connection refused")
        assert "READ-ONLY" in screen
        tmux.keys("/")
        tmux.wait_screen("filter: part of a node name")
        tmux.keys("gpu03", "Enter")
        tmux.wait_screen("filter gpu03: 1/4 shown")
        tmux.keys("Enter")
        screen = tmux.wait_screen("NEEDS ATTENTION")
        assert "gpu03" in screen and "crashed" in screen
        tmux.keys("Escape")
        tmux.wait_screen("gpuwarden fleet")
        tmux.keys("q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "gpuwarden fleet" in tmux.screen():
            time.sleep(0.1)
        assert "gpuwarden fleet" not in tmux.screen()
    finally:
        tmux.kill()
