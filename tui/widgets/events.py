"""The Events panel: phase changes, crashes, residual VRAM, drains and playbook steps, newest on top.

Keeps the last few hundred events; draws only as many as fit.
"""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual.widget import Widget

from gpuwarden.tui.node_events import NodeEvent
from gpuwarden.tui.styles import STYLES as S

STYLE = {"info": "", "ok": S["phase.good"], "warning": S["phase.busy"], "error": S["phase.bad"]}


class EventsPanel(Widget):
    DEFAULT_CSS = "EventsPanel { height: 1fr; }"

    def __init__(self, keep: int = 500, **kw):
        super().__init__(**kw)
        self.border_title = "Events"
        self.events: deque[NodeEvent] = deque(maxlen=keep)

    def add(self, events: list[NodeEvent]) -> None:
        if events:
            self.events.extend(events)
            self.refresh()

    def render(self) -> Text:
        rows = max(self.content_size.height, 1)
        t = Text(no_wrap=True, overflow="ellipsis")
        if not self.events:
            t.append("no events yet", style="dim")
            return t
        for i, e in enumerate(reversed(self.events)):
            if i >= rows:
                break
            if i:
                t.append("\n")
            t.append(time.strftime("%H:%M:%S ", time.localtime(e.ts)), style="dim")
            t.append(e.text, style=STYLE.get(e.level, ""))
        return t
