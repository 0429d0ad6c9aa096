"""The Processes panel's actions: / filters it, k stops the selected process (signal chosen in a dialog), and the
process view's signal menu sends one signal.

Mixed into the app. Stopping runs the stop-process playbook in a worker, like every other action.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input

from gpuwarden.tui.widgets.processes import ProcessesPanel
from gpuwarden.tui.runner import PlaybookRun
from gpuwarden.tui.screens.progress import ProgressScreen
from gpuwarden.tui.screens.stop_process import StopProcessScreen
from gpuwarden.playbooks.stopproc import StopProcessPlaybook
from gpuwarden.playbooks.signalproc import SignalProcessPlaybook

GRACE_S = 5.0


class FilterInput(Input):
    """The filter of one table (the one focused when / was pressed): narrows as you type; Enter keeps it,
    Escape clears it."""

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]
    DEFAULT_CSS = "FilterInput { display: none; height: 3; }"
    target = None  # the table it filters

    def action_clear(self) -> None:
        self.value = ""
        table = self.target or self.app.query_one(ProcessesPanel)
        table.set_filter("")
        self.display = False
        table.focus()


FILTERABLE = {"gpus": "the GPUs", "engines": "the engines", "processes": "the processes"}


class ProcessActionsMixin:
    def action_filter_processes(self) -> None:
        panel = self.query_one(ProcessesPanel)  # type: ignore[attr-defined]
        if not panel.display:
            self.apply_layout("processes")  # type: ignore[attr-defined]
        self._open_filter(panel)

    def action_filter_table(self) -> None:
        """/ on any table: filter that one (the Processes panel when the focus is elsewhere)."""
        focused = self.focused  # type: ignore[attr-defined]
        if getattr(focused, "id", None) in FILTERABLE and hasattr(focused, "set_filter"):
            self._open_filter(focused)
        else:
            self.action_filter_processes()

    def _open_filter(self, table) -> None:
        box = self.query_one(FilterInput)  # type: ignore[attr-defined]
        box.target = table
        box.placeholder = f"filter {FILTERABLE.get(table.id, 'the table')} (Enter keeps it, Esc clears it)"
        box.display = True
        box.value = table.filter_text
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if isinstance(event.input, FilterInput):
            (event.input.target or self.query_one(ProcessesPanel)).set_filter(event.value)  # type: ignore

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if isinstance(event.input, FilterInput):
            event.input.display = False
            (event.input.target or self.query_one(ProcessesPanel)).focus()  # type: ignore[attr-defined]

    def action_stop_process(self) -> None:
        if not self.may_act():  # type: ignore[attr-defined]
            return
        panel = self.query_one(ProcessesPanel)  # type: ignore[attr-defined]
        process = panel.selected() if panel.display else None
        if process is None:
            self.notify("select a process first (p shows the Processes panel)", severity="warning")  # type: ignore
            return
        if process.state == "zombie":
            # It has exited already: no signal reaches it, only its parent's wait() frees what it holds.
            gpus = sorted(process.vram)
            where = f"select GPU {gpus[0]} and press f (fix) or P (purge)" if gpus else "press f or P on its GPU"
            parent = f"its parent pid {process.ppid}" if process.ppid else "its parent"
            self.notify(f"pid {process.pid} is a zombie: it has exited, TERM and KILL cannot reach it. "
                        f"Its VRAM goes when {parent} reaps it: {where}, which reap it through the parent.",
                        severity="warning", timeout=10)  # type: ignore[attr-defined]
            return

        def chosen(how: str | None) -> None:
            if how is None:
                return
            pb = StopProcessPlaybook(process, kill_now=how == "KILL", grace_s=GRACE_S)
            # The dialog was the confirmation: the runner must not ask a second time.
            run = PlaybookRun(self, pb, self.settings, f"Stop pid {process.pid}", confirmed=True)  # type: ignore
            self.current_run = run  # type: ignore[attr-defined]
            self.push_screen(ProgressScreen(run))  # type: ignore[attr-defined]
            run.start()
        self.push_screen(StopProcessScreen(process, GRACE_S), chosen)  # type: ignore[attr-defined]

    def send_process_signal(self, process, name: str, ends: bool) -> None:
        """The process view's menu: send SIG`name` through the signal playbook (asks first when `ends`)."""
        if not self.may_act():  # type: ignore[attr-defined]
            return
        pb = SignalProcessPlaybook(process, name, ends=ends)
        # Destructive (it ends or freezes the process): the runner's dialog, Cancel focused, shows the step first.
        run = PlaybookRun(self, pb, self.settings, f"SIG{name} to pid {process.pid}")  # type: ignore[attr-defined]
        self.current_run = run  # type: ignore[attr-defined]
        self.push_screen(ProgressScreen(run))  # type: ignore[attr-defined]
        run.start()
