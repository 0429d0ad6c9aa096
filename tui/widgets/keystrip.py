"""A one-line strip of keys at the bottom of a screen, drawn once (keys only, no words, when it is narrow).

Textual's Footer rebuilds its key widgets on every screen or focus change, which on a small machine costs
more than the change itself; these keys are fixed for a screen's life, so a plain line does the job.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ..styles import STYLES as S

ALWAYS_NAMED = 2  # the first keys keep their words in the narrow form (q Quit, ? Keys)


class KeyStrip(Widget):
    DEFAULT_CSS = "KeyStrip { dock: bottom; height: 1; width: 1fr; background: $panel; }"

    def __init__(self, keys: list[tuple[str, str]], **kw):
        super().__init__(**kw)
        self._full = self._draw(keys, len(keys))
        self._narrow = self._draw(keys, ALWAYS_NAMED)

    @staticmethod
    def _draw(keys: list[tuple[str, str]], named: int) -> Text:
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, (key, what) in enumerate(keys):
            t.append(f" {key} ", style=S["key"])
            t.append(f"{what} " if i < named else "")
        return t

    def render(self) -> Text:
        return self._full if self._full.cell_len <= self.size.width else self._narrow
