"""A one-line strip of keys at the bottom of a screen, drawn once.

Textual's Footer rebuilds its key widgets on every screen or focus change, which on a small machine costs
more than the change itself; these keys are fixed for a screen's life, so a plain line does the job.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ..styles import STYLES as S


class KeyStrip(Widget):
    DEFAULT_CSS = "KeyStrip { dock: bottom; height: 1; width: 1fr; background: $panel; }"

    def __init__(self, keys: list[tuple[str, str]], **kw):
        super().__init__(**kw)
        self._text = Text(no_wrap=True, overflow="ellipsis")
        for key, what in keys:
            self._text.append(f" {key} ", style=S["key"])
            self._text.append(f"{what} ")

    def render(self) -> Text:
        return self._text
