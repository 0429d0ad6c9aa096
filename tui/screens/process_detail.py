"""One process in detail (Enter or i on the Processes panel): its whole command line (redacted), owner, parent, cwd,
threads, host and GPU load per engine, the GPUs and VRAM it holds, and a signal menu (TERM ... KILL, CONT).

The /proc reads run in a worker thread (cmdline can wait on the process's memory lock); the load follows the live
snapshots. A signal goes through the signal-process playbook: target re-checked, journalled, confirmed if it ends
or freezes the process.
"""

from __future__ import annotations

import signal

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

from gpuwarden.ops.node import procs
from gpuwarden.ops.foundation.model import GpuProcess, NodeSnapshot, ProcessLoad

from gpuwarden.tui import text
from gpuwarden.tui.styles import STYLES as S
from gpuwarden.tui.widgets.keystrip import KeyStrip
from gpuwarden.tui.widgets.processes import cpu_time, percent
from gpuwarden.tui.screens.gpu_detail import GpuDetailScreen

SIGNAL_ORDER = ("TERM", "INT", "HUP", "USR1", "USR2", "QUIT", "STOP", "CONT", "KILL")


def _names(numbers: frozenset[int]) -> str:
    out = []
    for n in sorted(numbers):
        try:
            out.append(signal.Signals(n).name[3:])
        except ValueError:
            out.append(str(n))  # real-time signals
    return ", ".join(out) or "none"


def load_lines(p: GpuProcess, load: ProcessLoad | None, snap: NodeSnapshot) -> Text:
    """Host load, then per GPU: VRAM, GPU% and each engine's share and busy time."""
    t = Text()
    if load is None:
        t.append("host load: n/a (not in the latest snapshot)", style="dim")
    else:
        t.append(f"host CPU {percent(load.cpu_percent)}   RSS {text.size(load.rss_bytes)}   "
                 f"threads {load.threads if load.threads is not None else '-'}   CPU time {cpu_time(load.cpu_time_s)}")
    gpus = sorted(set(p.vram) | set(load.gpus if load else ()))
    for gi in gpus:
        g = snap.gpu(gi)
        t.append(f"\nGPU {gi}", style="bold")
        t.append(f" {g.name}" if g else "")
        vram = p.vram.get(gi)
        t.append(f"   VRAM {text.size(vram)} ({p.sources.get(gi, '-')})" if vram is not None else "   VRAM -")
        gl = load.gpus.get(gi) if load else None
        if gl is None:
            why = "no per-process GPU time from this backend" if not (load and load.source) else \
                "no DRM client of its own here (ROCm/KFD queues do not show in fdinfo)"
            t.append(f"   GPU% n/a: {why}", style="dim")
            continue
        t.append(f"   GPU {percent(gl.percent)}")
        if gl.engines:
            t.append("   " + "  ".join(f"{name} {v:.0f}%" for name, v in sorted(gl.engines.items())))
        if gl.engine_ns:
            t.append("\n  busy time since its clients opened: "
                     + ", ".join(f"{name} {ns / 1e9:.1f} s" for name, ns in sorted(gl.engine_ns.items())))
        if gl.clients:
            t.append(f"\n  {gl.clients} DRM client(s)" + (f", VRAM {text.size(gl.vram_bytes)} by fdinfo"
                                                         if gl.vram_bytes is not None else ""))
        if gl.shared_with:
            t.append(f"; also held by pid {', '.join(map(str, gl.shared_with))} (counted here, once)", style="dim")
    if p.device_files:
        t.append(f"\ndevice files: {', '.join(p.device_files)}", style="dim")
    return t


class ProcessDetailScreen(Screen[None]):
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("q", "app.pop_screen", "Back"),
                ("backspace", "app.pop_screen", "Back"), ("g", "gpu", "Its GPU")]

    def __init__(self, process: GpuProcess, snap: NodeSnapshot, *, read_only: bool = False):
        super().__init__()
        self.process = process
        self.snap = snap
        self.read_only = read_only
        self.facts: dict | None = None  # procs.details(), once the worker has read them

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="proc-detail"):
            yield Static(self._head(), id="proc-head")
            yield Static("", id="proc-facts")
            yield Static("", id="proc-load")
            if self.read_only:
                yield Label("read-only: no signals", id="signal-note")
            elif not self.process.alive:
                yield Label(f"pid {self.process.pid} is {self.process.state}: no signal reaches it "
                            "(a zombie goes when its parent reaps it: f or P on its GPU)", id="signal-note")
            else:
                yield Label("Send a signal (↑ ↓, Enter; the ones that end or freeze it ask first):", id="signal-note")
                yield OptionList(*[Option(f"{name:<5} {procs.SIGNALS[name]}", id=name) for name in SIGNAL_ORDER],
                                 id="signals")
        yield KeyStrip([("q/esc", "Back"), ("g", "Its GPU"), ("enter", "Send")])

    def _head(self) -> Text:
        p = self.process
        t = Text()
        t.append(f"pid {p.pid}", style="bold")
        t.append(f"   {p.state}", style="" if p.alive else S["phase.bad"])
        age = self.snap.taken_at - p.start_time if p.start_time else None
        t.append(f"   up {text.duration(age)}   user {p.user or '?'}   parent {p.ppid if p.ppid is not None else '-'}")
        if p.pod:
            t.append(f"\npod {p.namespace}/{p.pod} container {p.container_name or '-'}")
        elif p.container:
            t.append(f"\ncontainer {p.container}")
        return t

    def on_mount(self) -> None:
        self.query_one("#proc-facts", Static).update(Text("reading /proc ...", style="dim"))
        self.show_snapshot(self.snap)
        self.run_worker(self._read_facts, thread=True, exclusive=True, group="proc-facts")
        for menu in self.query("#signals"):
            menu.focus()

    def _read_facts(self) -> None:
        facts = procs.details(self.process.pid, getattr(self.app, "settings", None).proc_root
                              if getattr(self.app, "settings", None) is not None else "/proc")
        self.app.call_from_thread(self._show_facts, facts)

    def _show_facts(self, facts: dict | None) -> None:
        self.facts = facts
        t = Text()
        if facts is None:
            t.append(f"pid {self.process.pid} has exited: nothing more to read", style=S["phase.bad"])
        else:
            t.append("command ", style="bold")
            t.append(str(facts["command"]))  # redacted by procs.command_from, escapes made visible
            t.append(f"\ncwd {facts['cwd'] or '-'}   uid {facts['uid'] if facts['uid'] is not None else '-'}"
                     f" ({facts['user'] or '?'})   threads {facts['threads'] if facts['threads'] is not None else '-'}")
            t.append(f"\nhandles: {_names(facts['caught'])}   ignores: {_names(facts['ignored'])}", style="dim")
        self.query_one("#proc-facts", Static).update(t)

    def show_snapshot(self, snap: NodeSnapshot) -> None:
        """(every live snapshot) The load of the same process (pid and start time), if it is still there."""
        self.snap = snap
        p = self.process
        now = next((q for q in snap.processes if q.pid == p.pid and q.start_time == p.start_time), None)
        if now is not None:
            self.process = now
        self.query_one("#proc-load", Static).update(load_lines(self.process, snap.process_load.get(p.pid), snap)
                                                    if now is not None else
                                                    Text("no longer a GPU process in the latest snapshot", style="dim"))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        name = event.option.id
        if name is None:
            return
        facts = self.facts or {}
        ends = procs.ends_or_freezes(name, facts.get("caught", frozenset()), facts.get("ignored", frozenset()))
        self.app.send_process_signal(self.process, name, ends)  # type: ignore[attr-defined]

    def action_gpu(self) -> None:
        p = self.process
        gpus = sorted(p.vram, key=lambda g: -p.vram[g]) or [g.index for g in self.snap.gpus
                                                           if set(g.device_files) & set(p.device_files)]
        if not gpus:
            self.notify(f"pid {p.pid} holds no VRAM and no GPU's device file", severity="warning")
            return
        self.app.push_screen(GpuDetailScreen(gpus[0], self.snap))
