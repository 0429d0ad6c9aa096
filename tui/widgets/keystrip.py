"""A one-line strip of keys at the bottom of a screen: every key with its word, or, where that does not fit, the
most important keys with theirs; never a bare key nobody can read.

Textual's Footer rebuilds its key widgets on every screen or focus change, which on a small machine costs
more than the change itself; these keys are fixed for a screen's life, so a plain line does the job.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from gpuwarden.tui.styles import STYLES as S

# Short words for the compact form (a word that fits 100 columns with every key).
SHORT = {"Baseline": "Base", "Details": "Info", "Palette": "Cmds"}
COMPACT_KEYS = {"enter": "↵"}


class KeyStrip(Widget):
    DEFAULT_CSS = "KeyStrip { dock: bottom; height: 1; width: 1fr; background: $panel; }"

    def __init__(self, keys: list[tuple[str, str]], *, priority: list[str] | None = None, **kw):
        """`priority`: keys most important first; where not every key fits, the last ones are left out
        (the first of all, `?` on the main screen, says where the rest are)."""
        super().__init__(**kw)
        self._keys = list(keys)
        order = [k for k in (priority or []) if any(k == key for key, _ in keys)]
        self._priority = order + [k for k, _ in keys if k not in order]
        self._full = self._draw_full(self._keys)
        self._by_width: dict[int, Text] = {}

    @staticmethod
    def _draw_full(keys: list[tuple[str, str]]) -> Text:
        t = Text(no_wrap=True, overflow="ellipsis")
        for key, what in keys:
            t.append(f" {key} ", style=S["key"])
            t.append(f"{what} ")
        return t

    @staticmethod
    def _draw_compact(keys: list[tuple[str, str]]) -> Text:
        """A menu's accelerators: the key highlighted as the first letter of its word ("Reset" with R marked,
        "restart" with r), so r and R never read as "rRst" and "RRset"; other keys before their word."""
        t = Text(no_wrap=True, overflow="ellipsis")
        for key, what in keys:
            word = SHORT.get(what, what.split()[0] if len(what) > 8 else what)
            t.append(" ")
            if len(key) == 1 and word[:1].lower() == key.lower():
                t.append(key, style=S["key"])
                t.append(word[1:].lower() if key.islower() else word[1:])
            else:
                t.append(COMPACT_KEYS.get(key, key), style=S["key"])
                t.append(f" {word}")
        return t

    def form(self, width: int) -> Text:
        """What the strip shows `width` cells wide."""
        if self._full.cell_len <= width:
            return self._full
        hit = self._by_width.get(width)
        if hit is not None:
            return hit
        shown = list(self._keys)
        drop = list(reversed(self._priority))
        t = self._draw_compact(shown)
        while t.cell_len > width and len(shown) > 1:
            gone = drop.pop(0)
            shown = [k for k in shown if k[0] != gone]
            t = self._draw_compact(shown)
        self._by_width[width] = t
        return t

    def render(self) -> Text:
        return self.form(self.size.width)
