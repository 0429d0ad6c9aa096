"""The fleet console App: the node console (GpuwardenApp's own panels and keys) with the fleet screen on top.

Enter on a node feeds the console from that node's snapshot stream; Escape goes back to the fleet.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from textual.binding import Binding

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import NodeSnapshot, snapshot_from_dict
from gpuwarden.ops.foundation.settings import Settings

from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.history import VramHistory
from gpuwarden.tui.widgets.events import EventsPanel
from gpuwarden.ops.sampling.thread import SamplingThread
from gpuwarden.playbooks.fleet import actions
from gpuwarden.tui.fleet.screen import FleetScreen
from gpuwarden.tui.fleet.remote_run import RemotePlaybookRun

# Which remote playbook each console key runs on the node.
REMOTE = {
    "launch": lambda t: ("launch", ()),
    "stop": lambda t: ("stop_engine", (t.engine or "",)),
    "drain": lambda t: ("drain", (t.gpu,)),
    "undrain": lambda t: ("undrain", (t.gpu,)),
    "reset": lambda t: ("reset", (t.gpu,)),
    "purge": lambda t: ("purge", (t.gpu,)),
    "baseline": lambda t: ("baseline", (None,)),
    "bundle": lambda t: ("bundle", ()),
}


class FleetApp(GpuwardenApp):
    CSS_PATH = str(Path(__file__).resolve().parent.parent / "theme.tcss")  # the console's, not a file beside this one
    BINDINGS = GpuwardenApp.BINDINGS + [Binding("escape", "fleet", "Fleet")]

    def __init__(self, settings: Settings, monitor, fleet_target, *, refresh_s: float = 1.0, read_only: bool = False,
                 watch_terminal: bool = False):
        super().__init__(settings, source=self._node_snapshot, refresh_s=refresh_s, read_only=read_only,
                         on_exit=None, watch_terminal=watch_terminal)
        self.monitor = monitor
        self.fleet_target = fleet_target
        self.node: str | None = None
        self._seq = 0

    # --- the fleet screen and switching nodes ---------------------------------------------------
    def _start_sampling(self) -> None:
        self.push_screen(FleetScreen(self.monitor, refresh_s=self.refresh_s, read_only=self.read_only))

    def open_node(self, name: str) -> None:
        """Show node `name` in the console: its own state from now on, nothing of the previous node."""
        if self.sampler is not None:
            self.sampler.stop()
        self.monitor.pin(name)  # with Prometheus, the node open here is streamed over SSH too
        self.node, self._seq = name, 0
        self.snapshot, self.last_arrival, self.sample_error = None, None, None
        self.history = VramHistory()
        self.reset_chart_history()  # the charts follow the node open now, nothing of the previous one
        self.last_bundle = None
        events = self.query_one(EventsPanel)
        events.events.clear()
        events.refresh()
        self.query_one("#header").show(None)
        self.sampler = SamplingThread(self.source, self.refresh_s, self._deliver, self._failed)
        self.sampler.start()
        self._started = time.monotonic()
        if isinstance(self.screen, FleetScreen):
            self.pop_screen()
        self.query_one("#gpus").focus()

    def action_fleet(self) -> None:
        if isinstance(self.screen, FleetScreen):
            return
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self.node = None
        self.monitor.pin(None)
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.push_screen(FleetScreen(self.monitor, refresh_s=self.refresh_s, read_only=self.read_only))

    def _node_snapshot(self) -> NodeSnapshot:
        """The sampler's source: the open node's next snapshot from its stream (waits up to two intervals)."""
        name = self.node
        if name is None:
            raise GpuwardenError("no node open")
        seq, snap, error = self.monitor.wait_newer(name, self._seq, 2 * self.refresh_s)
        if snap is None or seq == self._seq:
            raise GpuwardenError(f"{name}: no new snapshot", error or "the node's stream is quiet")
        self._seq = seq
        node = snapshot_from_dict(snap)
        label = name if node.hostname == name else f"{name} ({node.hostname})"
        return dataclasses.replace(node, hostname=label, source=f"ssh:{name}")

    # --- the sparklines' minutes before the node was opened, from Prometheus -------------------------
    def _can_backfill(self, first: NodeSnapshot) -> bool:
        return hasattr(self.monitor, "vram_backfill")

    def _backfill(self, first: NodeSnapshot) -> None:
        """(worker thread) The node's VRAM use per GPU over the sparkline's span, from its series in Prometheus."""
        name = self.node
        if name is None:
            return
        span, step = self.history.span_s, self.history.bucket_s
        samples = self.monitor.vram_backfill(name, first.taken_at - span, step)
        if samples and self.node == name:
            self.call_from_thread(self._apply_backfill, samples, [])

    # --- keys act on the open node, remotely -----------------------------------------------------
    def _new_run(self, spec, target, title: str):
        if self.node is None:
            raise GpuwardenError("no node open", "press Enter on a node first")
        builder, args = REMOTE[spec.name](target)
        remote = getattr(actions, builder)(*args)
        return RemotePlaybookRun(self, self.monitor, self.fleet_target, self.node, remote, title)
