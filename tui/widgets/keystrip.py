"""A one-line strip of keys at the bottom of a screen, drawn once: words, short words, or keys alone by width.

Textual's Footer rebuilds its key widgets on every screen or focus change, which on a small machine costs
more than the change itself; these keys are fixed for a screen's life, so a plain line does the job.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ..styles import STYLES as S

ALWAYS_NAMED = 2  # the first keys keep their words in the narrowest form (q Quit, ? Keys)
# Words of four letters or fewer for the middle form; others are cut to four.
SHORT = {"Launch": "Lnch", "Restart": "Rst", "Drain": "Drn", "Undrain": "Undr", "Reset": "Rset", "Purge": "Prg",
         "Baseline": "Base", "Bundle": "Bndl", "Procs": "Proc", "Details": "Info", "Palette": "Cmds"}
COMPACT_KEYS = {"enter": "↵"}


class KeyStrip(Widget):
    DEFAULT_CSS = "KeyStrip { dock: bottom; height: 1; width: 1fr; background: $panel; }"

    def __init__(self, keys: list[tuple[str, str]], **kw):
        super().__init__(**kw)
        # Widest first: every word; then Midnight Commander's style (the highlighted key right before a
        # short word), which fits sixteen labelled keys in 100 columns; then keys alone.
        self._forms = [self._draw(keys, len(keys)), self._compact(keys), self._draw(keys, ALWAYS_NAMED)]

    @staticmethod
    def _draw(keys: list[tuple[str, str]], named: int) -> Text:
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, (key, what) in enumerate(keys):
            t.append(f" {key} ", style=S["key"])
            t.append(f"{what} " if i < named else "")
        return t

    @staticmethod
    def _compact(keys: list[tuple[str, str]]) -> Text:
        t = Text(no_wrap=True, overflow="ellipsis")
        for key, what in keys:
            t.append(" ")
            t.append(COMPACT_KEYS.get(key, key), style=S["key"])
            t.append(SHORT.get(what, what[:4]))
        return t

    def render(self) -> Text:
        width = self.size.width
        return next((form for form in self._forms if form.cell_len <= width), self._forms[-1])
