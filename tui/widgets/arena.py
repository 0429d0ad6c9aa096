"""The Arena panel: each arena's path, size, header state and mappers, and who registered how much how fast.

Plain text: an arena has a handful of mappers, so a table would only add chrome.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuwarden.ops.engines import registrations, runtime_errors
from gpuwarden.ops.foundation.model import NodeSnapshot

from gpuwarden.tui import text
from gpuwarden.tui.styles import STYLES as S


class ArenaPanel(Static):
    def __init__(self, **kw):
        super().__init__("", **kw)
        self.border_title = "Arena"
        self._last: str | None = None

    def show(self, snap: NodeSnapshot) -> None:
        t = Text()
        if not snap.arenas:
            t.append("no arena configured or mapped", style="dim")
        for i, a in enumerate(snap.arenas):
            if i:
                t.append("\n")
            t.append(a.path, style="bold")
            t.append(f"\n{text.size(a.size)}, header ")
            t.append(a.header_state, style=S["phase.good"] if a.header_state == "ok" else S["phase.bad"])
            regs = sum(1 for m in a.mappers if m.registered)
            t.append(f"\n{len(a.mappers)} mapped, {regs} registered")
            for m in a.mappers:
                mark = {True: ("registered", S["phase.good"]), False: ("mapped only", S["phase.busy"]),
                        None: ("registered?", "dim")}[m.registered]
                gpu = "" if m.gpu is None else f"GPU{m.gpu} "
                t.append(f"\n {m.pid} {gpu}")
                t.append(mark[0], style=mark[1])
        self._registrations(t, snap)
        self._ledger(t, snap)
        self._driver(t, snap)
        key = t.markup
        if key != self._last:
            self._last = key
            self.update(t)

    def _driver(self, t: Text, snap: NodeSnapshot) -> None:
        """The driver's own books (debugfs): KFD system memory against its limit, VRAM fragmentation."""
        d = snap.driver
        if not d:
            return
        k = d.get("kfd_mem_limit")
        t.append("\nKFD system memory ", style="bold")
        if k:
            share = k["system_used"] / max(k["system_limit"], 1)
            t.append(f"{text.size(k['system_used'])} / {text.size(k['system_limit'])}",
                     style=S["phase.bad"] if share > 0.9 else S["phase.good"])
        elif d.get("kfd_mem_limit_computed"):
            c = d["kfd_mem_limit_computed"]
            t.append(f"limit {text.size(c['system_limit'])} (computed from RAM {text.size(c['mem_total'])}: "
                     "debugfs not readable, used unknown)", style="dim")
        else:
            t.append("not readable (root, debugfs): `arena budget` computes it", style="dim")
        # 0.95: above every healthy serving GPU measured (0.9375 at most), below crumbs (tests/bench/
        # bench_fragmentation.py; the opt-in alert in deploy/prometheus/gpuwarden-fragmentation-alerts.yml agrees).
        frag = [v for v in d.get("vram_free") or () if (v.get("fragmentation") or 0) > 0.95]
        for v in frag:
            t.append(f"\n GPU{v['gpu']} VRAM fragmented: largest free {text.size(v['largest_free_block'])} "
                     f"of {text.size(v['free'])} free", style=S["phase.busy"])

    def _ledger(self, t: Text, snap: NodeSnapshot) -> None:
        """The KFD ledger: each engine's registered and pinned bytes (both charged against KFD's one system-memory
        limit) and its failed host calls, the newest named."""
        rows = [e for e in snap.engines if e.host_ledger is not None or e.failed_call_count]
        if not rows:
            return
        t.append("\nKFD ledger (registered + pinned)", style="bold")
        for e in rows:
            gpu = "" if e.gpu is None else f" GPU{e.gpu}"
            t.append(f"\n {e.name}{gpu} {text.size(e.registered_bytes or 0)} + {text.size(e.pinned_bytes or 0)}")
            if e.pinned_peak_bytes and e.pinned_peak_bytes > (e.pinned_bytes or 0):
                t.append(f" (peak {text.size(e.pinned_peak_bytes)})", style="dim")
            if e.failed_call_count:
                last = e.failed_calls[-1] if e.failed_calls else None
                said = (f"{last.call} of {text.size(last.bytes)}: "
                        f"{runtime_errors.describe(last.call, last.result)}" if last else "")
                t.append(f"  {e.failed_call_count} failed" + (f", last {said}" if said else ""), style=S["phase.bad"])

    def _registrations(self, t: Text, snap: NodeSnapshot) -> None:
        """Each engine's latest registration: size, time in the call, time waiting at the gate."""
        latest = [(e, registrations.latest(e.registrations)) for e in snap.engines]
        latest = [(e, r) for e, r in latest if r is not None]
        if not latest:
            return
        t.append("\nregistrations", style="bold")
        for engine, reg in latest:
            style = {"registered": S["phase.good"], "running": S["phase.busy"]}.get(reg.outcome, S["phase.bad"])
            gpu = "" if engine.gpu is None else f" GPU{engine.gpu}"
            t.append(f"\n {engine.name}{gpu} ")
            t.append(registrations.describe(reg), style=style)
