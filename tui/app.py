"""The gpuwarden Textual application: live panels of the node and keys that start the same playbooks as the CLI.

Snapshots come from a SamplingThread (never the event loop); a watchdog marks the panels stale when they stop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import termios
import time
from pathlib import Path
from typing import Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.foundation.settings import Settings

from gpuwarden.tui import node_events
from gpuwarden.tui.actions import ACTIONS, Target, by_name
from gpuwarden.tui.history import VramHistory
from gpuwarden.tui.keyhints import with_keys
from gpuwarden.tui.messages import PlaybookFinished, PlaybookProgress, SamplingFailed, SnapshotArrived
from gpuwarden.tui.palette import GpuwardenCommands
from gpuwarden.tui.runner import PlaybookRun
from gpuwarden.tui import terminal_driver
from gpuwarden.ops.config.keys import MIN_REFRESH_S
from gpuwarden.ops.sampling.thread import SamplingThread, SnapshotSource
from gpuwarden.tui.text import duration
from gpuwarden.tui.widgets.arena import ArenaPanel
from gpuwarden.tui.widgets.engines import EnginesPanel
from gpuwarden.tui.widgets.events import EventsPanel
from gpuwarden.tui.widgets.gpus import GpusPanel, MARKS
from gpuwarden.tui.widgets.header import NodeHeader
from gpuwarden.tui.widgets.keystrip import KeyStrip
from gpuwarden.tui.widgets.processes import ProcessesPanel
from gpuwarden.tui.widgets.rowtable import RowTable
from gpuwarden.tui.layout import LayoutMixin
from gpuwarden.tui.prefs import Prefs
from gpuwarden.tui.process_actions import FilterInput, ProcessActionsMixin
from gpuwarden.tui.screens.engine_log import EngineLogScreen
from gpuwarden.tui.screens.help import HelpScreen
from gpuwarden.tui.screens.progress import ProgressScreen
from gpuwarden.tui.screens.triage import TriageScreen

STALE_FACTOR = 2.0  # no snapshot for this many intervals: the panels are marked stale
CHART_SAMPLE_S = 1.0  # the charts keep one sample a second: an hour at any refresh rate


class GpuwardenApp(LayoutMixin, ProcessActionsMixin, App):
    TITLE = "gpuwarden"
    CSS_PATH = "theme.tcss"
    COMMANDS = App.COMMANDS | {GpuwardenCommands}
    # View keys only; the action keys are bound per instance, and not at all when read-only.
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Keys", key_display="?"),
        Binding("t", "triage", "Triage", show=False),
        Binding("o", "progress", "Progress", show=False),
        Binding("ctrl+r", "refresh_now", "Refresh", show=False),
        Binding("p", "cycle_layout", "Layout", show=False),
        Binding("plus", "step_refresh(-1)", "Faster", show=False),
        Binding("minus", "step_refresh(1)", "Slower", show=False),
        Binding("colon", "go_to", "Go to", show=False),
        Binding("c", "charts", "Charts", show=False),
        Binding("x", "topology", "Topology", show=False),
        Binding("i", "process_detail", "Process", show=False),
    ]

    def get_driver_class(self) -> type[Driver]:
        """Textual's choice, with the terminal driver's input thread asleep between keys (see terminal_driver);
        a driver named in TEXTUAL_DRIVER (`serve`'s, or Textual's own to rule this one out) is left as named."""
        chosen = super().get_driver_class()
        if chosen is LinuxDriver and not os.environ.get("TEXTUAL_DRIVER") and terminal_driver.fits():
            return terminal_driver.QuietLinuxDriver
        return chosen

    def __init__(self, settings: Settings, *, source: SnapshotSource, refresh_s: float = 1.0,
                 read_only: bool = False, bundle: Path | None = None,
                 on_exit: Callable[[], None] | None = None, watch_terminal: bool = False,
                 prefs: Prefs | None = None, prefs_path: Path | None = None):
        super().__init__()
        self.prefs = prefs or Prefs()
        self.prefs_path = prefs_path  # None: settings changed here are not remembered (tests, replays)
        self.settings = settings
        self.source = source
        self.refresh_s = max(refresh_s, MIN_REFRESH_S)
        self.read_only = read_only or bundle is not None
        self.bundle = bundle
        self.last_bundle: Path | None = bundle
        self._on_exit = on_exit
        self._watch_terminal = watch_terminal
        self.snapshot: NodeSnapshot | None = None
        self.history = VramHistory()
        self.reset_chart_history()
        self.changes = node_events.ChangeTracker()
        self.last_arrival: float | None = None
        self.sample_error: str | None = None
        self.current_run: PlaybookRun | None = None
        self.sampler: SamplingThread | None = None
        self._started = time.monotonic()
        self._stale_shown = False
        self._quit_asked = float("-inf")
        self._process_gpu_shown = True  # every source starts asking it; the first watchdog tick tells it the view
        if not self.read_only:
            for spec in ACTIONS:
                self.bind(spec.key, f"act('{spec.name}')", description=spec.short)
            self.bind("k", "stop_process", description="Kill")

    # --- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield NodeHeader(refresh_s=self.refresh_s, read_only=self.read_only,
                         replay=str(self.bundle) if self.bundle else None, id="header")
        yield GpusPanel(id="gpus")
        yield EnginesPanel(id="engines")
        yield ProcessesPanel(id="processes")
        yield FilterInput(placeholder="filter processes (Enter keeps it, Esc clears it)", id="proc-filter")
        with Horizontal(id="bottom"):
            yield ArenaPanel(id="arena")
            yield EventsPanel(id="events")
        keys = [("q", "Quit"), ("?", "Keys")]
        if not self.read_only:
            keys += [(a.key, a.short) for a in ACTIONS] + [("k", "Kill")]
        keys += [("p", "Procs"), ("enter", "Details"), ("^p", "Palette")]
        # Where not all fit (80 columns): the GPU remedies first, then the views; ? lists the rest.
        yield KeyStrip(keys, priority=["q", "?", "f", "d", "R", "P", "k", "enter", "^p", "u", "p", "s", "r", "l",
                                       "b", "B"], id="keys")

    def on_mount(self) -> None:
        # The panels are composed once; finding them again on every refresh and watchdog tick (a DOM walk
        # each) was an eighth of an idle console's CPU on the H200 (tests/device/tui_profile.sh).
        self.gpus_panel, self.engines_panel = self.query_one(GpusPanel), self.query_one(EnginesPanel)
        self.processes_panel, self.arena_panel = self.query_one(ProcessesPanel), self.query_one(ArenaPanel)
        self.events_panel, self.header_bar = self.query_one(EventsPanel), self.query_one("#header", NodeHeader)
        self._stale_panels = list(self.query("#gpus, #engines, #processes, #arena"))
        self.header_bar.show(None)
        self._start_sampling()
        # Once a second at most: each tick costs the idle console's event loop about 0.3 ms (measured with the
        # stand-in NVML node, tests/device/tui_cpu_split.py's way), a quarter of its main thread at 2 Hz, and a
        # lost terminal or a stale view noticed within a second is soon enough.
        self.set_interval(min(1.0, self.refresh_s), self._watchdog)
        if self._watch_terminal:
            # SSH dropped, or asked to end: leave through the normal exit path instead of dying mid-write.
            for sig in (signal.SIGHUP, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, self.exit)
        self.query_one("#gpus").focus()
        self.apply_layout(self.prefs.layout)
        if self.prefs.theme and self.prefs.theme in self.available_themes:
            self.theme = self.prefs.theme
        self.watch(self, "theme", self.theme_changed, init=False)
        if self.prefs_note:
            self.notify(self.prefs_note, severity="warning")

    def reset_chart_history(self) -> None:
        """The GPU detail view's charts: the last hour at one sample a second, fed by the sampler thread."""
        # deferred: keeps the console's start cheap (0.7 ms there)
        from gpuwarden.ops.agent.history import History
        self.chart_history = History(None, interval_s=CHART_SAMPLE_S)
        self._chart_fed = float("-inf")

    def _start_sampling(self) -> None:
        """Start the sampler thread on self.source (the fleet console starts one per node it opens)."""
        self.sampler = SamplingThread(self.source, self.refresh_s, self._deliver, self._failed, close=self._on_exit)
        self.sampler.start()

    def on_unmount(self) -> None:
        if self.sampler:
            self.sampler.stop()
        if self.current_run and self.current_run.running:
            self.current_run.cancel()

    # --- sampling (called from the sampler thread) -----------------------------------------------
    def _deliver(self, snap: NodeSnapshot) -> None:
        if snap.taken_at - self._chart_fed >= 0.95 * CHART_SAMPLE_S:  # here, off the event loop
            self._chart_fed = snap.taken_at
            self.chart_history.add(snap)
        self.post_message(SnapshotArrived(snap))

    def _failed(self, error: str) -> None:
        self.post_message(SamplingFailed(error))

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        snap = message.snapshot
        self.last_arrival = time.monotonic()
        self.sample_error = None
        if self.snapshot is None and self._can_backfill(snap):
            # The agent watched before this console opened: its last minutes fill the sparklines and events.
            self.run_worker(lambda: self._backfill(snap), thread=True, exclusive=True, group="backfill")
        events = self.changes.feed(snap)
        self.snapshot = snap
        self.history.add(snap)
        self.processes_panel.feed(snap)
        self._draw(events)

    def _can_backfill(self, first: NodeSnapshot) -> bool:
        """Whether someone kept this node's history from before `first` (here: the agent that served it)."""
        return bool(first.agent) and hasattr(self.source, "agent_json")

    def _backfill(self, first: NodeSnapshot) -> None:
        """(worker thread) The agent's history of the sparkline's span and its latest events."""
        since = first.taken_at - self.history.span_s
        hist = self.source.agent_json(f"/v1/history?resolution=fine&since={since:.3f}")  # type: ignore[attr-defined]
        recent = self.source.agent_json("/v1/events?limit=50")  # type: ignore[attr-defined]
        totals = {g.index: g.vram_total for g in first.gpus if g.vram_total}
        samples = []
        for gpu, series in ((hist or {}).get("gpus") or {}).items():
            fine = series.get("fine") or {}
            total = totals.get(int(gpu))
            if not total or fine.get("t0") is None:
                continue
            samples += [(int(gpu), fine["t0"] + dt, used / total) for dt, used in zip(fine["t"], fine["used"])]
        lines = [node_events.NodeEvent(e["ts"], e["level"], e["text"], e.get("kind", "info"))
                 for e in (recent or {}).get("events", []) if e["ts"] < first.taken_at]
        self.call_from_thread(self._apply_backfill, samples, lines)

    def _apply_backfill(self, samples: list, lines: list) -> None:
        self.history.backfill(samples)
        if lines:
            self.query_one(EventsPanel).add(lines)
        self._draw([])

    def on_sampling_failed(self, message: SamplingFailed) -> None:
        if message.error != self.sample_error:
            self.query_one(EventsPanel).add([node_events.NodeEvent(time.time(), "error", message.error)])
        self.sample_error = message.error
        self._show_header()

    def _draw(self, events: list[node_events.NodeEvent]) -> None:
        snap = self.snapshot
        if snap is None:
            return
        width = self.size.width
        self.gpus_panel.show(snap, self.history, width)
        self.engines_panel.show(snap, width)
        self.processes_panel.show(snap, width)
        self.arena_panel.show(snap)
        self.events_panel.add(events)
        self._set_stale(False)
        self._show_header()
        screen = self.screen
        show = getattr(screen, "show_snapshot", None)
        if show is None:
            return
        if screen.is_mounted:
            try:
                show(snap)
                return
            except NoMatches:
                # A child the view draws into is not there (CI saw it once for the detail view's charts, with the
                # view mounted): never a reason for the console to die; the next snapshot draws the view again.
                pass
        screen.snap = snap  # type: ignore[attr-defined]  # not composed yet: its own on_mount shows the newest

    def on_resize(self) -> None:
        self._draw([])

    def stale_for(self) -> float | None:
        """Seconds since the last snapshot when that is over STALE_FACTOR intervals; else None."""
        since = self.last_arrival if self.last_arrival is not None else self._started
        age = time.monotonic() - since
        return age if age > STALE_FACTOR * self.refresh_s else None

    def _watchdog(self) -> None:
        if self._watch_terminal and not _terminal_alive():
            self.exit(return_code=0)
            return
        self._tell_process_gpu()
        stale = self.stale_for()
        self._set_stale(stale is not None, stale)
        if stale is not None or self.sample_error:
            self._show_header()

    def _set_stale(self, stale: bool, age: float | None = None) -> None:
        note = f"stale: {duration(age)} old" if stale and age is not None else ""
        for panel in self._stale_panels:
            if getattr(panel, "stale_note", "") != note:
                panel.stale_note = note
                panel.border_subtitle = " · ".join(x for x in (getattr(panel, "subtitle", ""), note) if x)
        if stale == self._stale_shown:
            return  # restyling three panels twice a second would be most of an idle TUI's work
        self._stale_shown = stale
        for panel in self._stale_panels:
            panel.set_class(stale, "stale")

    def _show_header(self) -> None:
        snap = self.snapshot
        self.header_bar.show(
            snap, stale_for=self.stale_for() if self.bundle is None else None, error=self.sample_error,
            attention=bool(snap and snap.needs_attention()))

    # --- views ----------------------------------------------------------------------------------
    def on_row_table_selected(self, message: RowTable.Selected) -> None:
        message.stop()
        self.action_details()

    def action_details(self) -> None:
        focused = self.focused
        if isinstance(focused, EnginesPanel):
            engine = focused.selected()
            if engine is None:
                self.notify("no engine selected")
                return
            self.push_screen(EngineLogScreen(engine.name, engine.log_path, engine))
            return
        if isinstance(focused, ProcessesPanel):
            self.action_process_detail()
            return
        else:
            gpu = self.query_one(GpusPanel).selected_gpu()
        if gpu is None or self.snapshot is None:
            self.notify("no GPU to show yet")
            return
        # deferred: keeps the console's start cheap (7.4 ms there); it brings the charting library
        from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen
        self.push_screen(GpuDetailScreen(gpu, self.snapshot))

    def action_process_detail(self) -> None:
        """Enter or i on a process: its detail view (command line, load per engine, signals)."""
        panel = self.query_one(ProcessesPanel)
        process = panel.selected() if panel.display else None
        if process is None or self.snapshot is None:
            self.notify("select a process first (p shows the Processes panel)", severity="warning")
            return
        # deferred: keeps the console's start cheap (9.2 ms there)
        from gpuwarden.tui.screens.process_detail import ProcessDetailScreen
        self.push_screen(ProcessDetailScreen(process, self.snapshot, read_only=self.read_only))

    def _process_gpu(self, panel: ProcessesPanel) -> int | None:
        """The GPU of the selected process: the one it holds most VRAM on, else the one whose device file
        it has open; None (and a note saying why) when it has neither."""
        process = panel.selected()
        if process is None or self.snapshot is None:
            self.notify("no process selected")
            return None
        if process.vram:
            return max(sorted(process.vram), key=lambda g: process.vram[g])
        files = set(process.device_files)
        gpu = next((g.index for g in self.snapshot.gpus if files.intersection(g.device_files)), None)
        if gpu is None:
            self.notify(f"pid {process.pid} holds no VRAM and no GPU's device file", severity="warning")
        return gpu

    def action_triage(self) -> None:
        path = self.last_bundle
        engine = self.query_one(EnginesPanel).selected()
        if path is None and engine is not None and engine.bundle:
            path = Path(engine.bundle)
        if path is None:
            self.notify("no bundle yet: " + ("start gpuwarden tui --bundle FILE" if self.read_only
                                            else "press B to collect one"), severity="warning")
            return
        self.push_screen(TriageScreen(path))

    def action_help(self) -> None:
        keys = [("↑ ↓", "move in the focused panel"), ("tab", "next panel"),
                ("enter", "details of the selection (on a process: its detail and signal menu, g there: its GPU)"),
                ("c", "the selected GPU's charts: last hour, 7 days with an agent"),
                ("x", "topology: hives, PCIe, NUMA, what a reset takes down"),
                ("i", "the selected process's detail: command line, load per engine, signals"),
                ("p", "layout: engines, processes, or both"), ("/", "filter the focused table (GPUs, engines, "
                                                                    "processes)"),
                ("+ -", "refresh faster / slower (remembered)"), (":", "go to any view or GPU (the palette)"),
                ("< > I", "processes: sort column, reverse"), ("T", "processes: tree by parent"),
                ("t", "triage of the last bundle"), ("o", "progress of the last playbook"),
                ("ctrl+r", "refresh now"), ("ctrl+p", "command palette"), ("?", "this list"), ("q", "quit")]
        if not self.read_only:
            keys = [(a.key, a.title) for a in ACTIONS] + [("k", "Stop the selected process (TERM/KILL; zombie: f/P)")] + keys
        note = "read-only: no action keys" if self.read_only else "destructive actions ask first; Cancel is the default"
        if not self.is_screen_installed("help"):  # built once: the keys do not change while the app runs
            self.install_screen(HelpScreen(keys, note, MARKS), name="help")
        self.push_screen("help")

    def action_refresh_now(self) -> None:
        if self.sampler:
            self.sampler.refresh_now()

    def action_progress(self) -> None:
        if self.current_run is None:
            self.notify("no playbook has run in this session")
            return
        self.push_screen(ProgressScreen(self.current_run))

    def _tell_process_gpu(self) -> None:
        """Per-process GPU% is asked of the GPU source only while a view shows it: the Processes panel, or a screen
        over the main one (a process's or a GPU's detail). Shown again, the next snapshot is taken at once."""
        shown = bool(self.processes_panel.display) or len(self.screen_stack) > 1
        if shown == self._process_gpu_shown:
            return
        self._process_gpu_shown = shown
        tell = getattr(self.source, "show_process_gpu", None)
        if tell is not None:
            tell(shown)
            if shown:
                self.action_refresh_now()

    async def action_quit(self) -> None:
        """Quit; while a playbook runs, only on a second q within a few seconds (leaving cuts it short)."""
        run = self.current_run
        if run is not None and run.running and time.monotonic() - self._quit_asked > 3.0:
            self._quit_asked = time.monotonic()
            self.notify(f"{run.title} is still running: press q again to leave anyway "
                        "(it stops after its current step)", severity="warning")
            return
        if run is not None and run.running:
            run.cancel()
            # In a thread: the run may still need the event loop (call_from_thread) to finish its step.
            await asyncio.to_thread(run.join, 2.0)
        self.exit()

    def palette_commands(self) -> list[tuple[str, str, str]]:
        """(title, help, action) for the command palette; no actions at all when read-only."""
        out = [("Show keys", "list every key", "help"), ("GPU details", "processes and holders of the selected GPU",
                                                          "details"),
               ("Bundle triage", "the triage summary of the last bundle", "triage"),
               ("Refresh now", "take a snapshot now", "refresh_now")] + self.layout_palette() + self.jump_palette()
        if not self.read_only:
            out = [(a.title, a.help, f"act('{a.name}')") for a in ACTIONS] + out
        return out

    def jump_palette(self) -> list[tuple[str, str, str]]:
        """Go to any view (`:` opens the palette): the panels, each GPU's detail, each engine's log."""
        out = [(f"Go to {title}", f"focus the {title} panel", f"focus_panel('{name}')")
               for name, title in (("gpus", "GPUs"), ("engines", "Engines"), ("processes", "Processes"))]
        out.append(("Go to playbook progress", "the last playbook's steps", "progress"))
        out.append(("Go to topology", "XGMI hives, PCIe parents, NUMA nodes and what a reset of each GPU takes down",
                    "topology"))
        snap = self.snapshot
        if snap is not None:
            out += [(f"Go to GPU {g.index}", f"the detail and charts of GPU {g.index} ({g.name})",
                     f"show_gpu({g.index})") for g in snap.gpus]
            out += [(f"Go to engine {e.name}", f"the log of engine {e.name}", f"show_engine({e.name!r})")
                    for e in snap.engines]
        return out

    def action_go_to(self) -> None:
        """`:` as in vim and k9s: the command palette, whose Go to entries reach every view."""
        self.action_command_palette()

    def action_focus_panel(self, name: str) -> None:
        panel = self.query_one(f"#{name}")
        if not panel.display:
            self.apply_layout("stacked")
            self.call_after_refresh(panel.focus)  # a panel just shown takes the focus once it is laid out
            return
        panel.focus()

    def action_show_gpu(self, index: int) -> None:
        if self.snapshot is None or self.snapshot.gpu(index) is None:
            self.notify(f"no GPU {index} in the latest snapshot", severity="warning")
            return
        # deferred: keeps the console's start cheap (7.4 ms there); it brings the charting library
        from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen
        self.push_screen(GpuDetailScreen(index, self.snapshot))

    def action_charts(self) -> None:
        """The selected GPU's detail view, whose charts follow its summary."""
        gpu = self.query_one(GpusPanel).selected_gpu()
        if gpu is None or self.snapshot is None:
            self.notify("no GPU to chart yet")
            return
        # deferred: keeps the console's start cheap (7.4 ms there); it brings the charting library
        from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen
        self.push_screen(GpuDetailScreen(gpu, self.snapshot, charts=True))

    def action_topology(self) -> None:
        if self.snapshot is None:
            self.notify("no snapshot yet: the topology needs the GPUs' list")
            return
        # deferred: keeps the console's start cheap (8.7 ms there)
        from gpuwarden.tui.screens.topology import TopologyScreen
        self.push_screen(TopologyScreen(self.snapshot))

    def action_show_engine(self, name: str) -> None:
        engine = next((e for e in (self.snapshot.engines if self.snapshot else ()) if e.name == name), None)
        if engine is None:
            self.notify(f"no engine {name} in the latest snapshot", severity="warning")
            return
        self.push_screen(EngineLogScreen(engine.name, engine.log_path, engine))

    # --- actions --------------------------------------------------------------------------------
    def _target(self) -> Target:
        engine = self.query_one(EnginesPanel).selected()
        return Target(gpu=self._action_gpu()[0], engine=engine.name if engine else None,
                      engine_gpu=engine.gpu if engine else None)

    def _action_gpu(self) -> tuple[int | None, str | None]:
        """The GPU a GPU action means: the focused process's or engine's, not the GPU table's cursor it may
        not show (issue 36: after `p`, `d` offered to drain the GPU under the hidden table's cursor). A process on
        several GPUs means the table's GPU when it is one of them, else none, with what to do."""
        table_gpu = self.query_one(GpusPanel).selected_gpu()
        focused = self.focused
        if isinstance(focused, ProcessesPanel) and focused.display:
            process = focused.selected()
            gpus = sorted(process.vram) if process is not None else []
            if process is None or not gpus:
                return table_gpu, None
            if len(gpus) == 1:
                return gpus[0], None
            if table_gpu in gpus:
                return table_gpu, None
            return None, (f"process {process.pid} uses GPUs {', '.join(map(str, gpus))}: select one in the "
                          "GPU table (tab) first")
        if isinstance(focused, EnginesPanel) and focused.display:
            engine = focused.selected()
            if engine is not None and engine.gpu is not None:
                return engine.gpu, None
        return table_gpu, None

    def may_act(self) -> bool:
        """Whether a playbook may start now; when not, the operator is told why."""
        if self.read_only:  # the keys are gone; this catches anything else that asks
            self.notify("read-only: actions are disabled", severity="warning")
            return False
        if self.current_run is not None and self.current_run.running:
            self.notify(f"{self.current_run.title} is still running (o shows it)", severity="warning")
            return False
        return True

    def action_act(self, name: str) -> None:
        if not self.may_act():
            return
        spec = by_name(name)
        target = self._target()
        if spec.needs == "gpu" and target.gpu is None:
            self.notify(self._action_gpu()[1] or "select a GPU first", severity="warning")
            return
        if spec.needs == "engine" and target.engine is None:
            self.notify("select an engine first (tab to the Engines panel)", severity="warning")
            return
        try:
            run = self._new_run(spec, target, spec.title_for(target))
        except GpuwardenError as exc:
            self.notify(with_keys(f"{spec.title}: {exc.message}" + (f"\n{exc.hint}" if exc.hint else "")),
                        severity="error")
            return
        self.current_run = run
        self.push_screen(ProgressScreen(run))
        run.start()

    def _new_run(self, spec, target: Target, title: str) -> PlaybookRun:
        """The run behind an action key: this node's playbook in a thread (the fleet console runs it remotely)."""
        return PlaybookRun(self, spec.build(self.settings, target), self.settings, title)

    def on_playbook_progress(self, message: PlaybookProgress) -> None:
        line = node_events.from_playbook(message.event)
        if line is not None:
            self.query_one(EventsPanel).add([line])
        self._refresh_progress(message.run)

    def on_playbook_finished(self, message: PlaybookFinished) -> None:
        run = message.run
        result = run.result
        if result is not None:
            path = result.data.get("bundle") or result.data.get("path")
            if run.playbook.name == "bundle" and path:
                self.last_bundle = Path(path)
            if not result.ok and result.refused != "cancelled":
                self.notify(with_keys(f"{run.title}: " + (result.refused or f"failed at {result.failed_step}")),
                            severity="error")
        self._refresh_progress(run)
        self.action_refresh_now()

    def _refresh_progress(self, run: PlaybookRun) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, ProgressScreen) and screen.run is run and screen.is_mounted:
                screen.refresh_lines()


def _terminal_alive() -> bool:
    """False once the controlling terminal has hung up (SSH dropped): terminal ioctls then fail."""
    try:
        termios.tcgetattr(0)
        return True
    except (termios.error, OSError):
        return False
