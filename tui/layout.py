"""The console's layout and remembered settings: which panels fill the middle (p cycles), theme, refresh.

Mixed into the app; the settings live in tui/prefs.py's file and are saved when the operator changes one.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.tui.prefs import LAYOUTS, Prefs, save

REFRESH_CHOICES = (0.5, 1.0, 2.0, 5.0)


class LayoutMixin:
    """Needs: self.prefs (Prefs), self.prefs_path (Path | None: None keeps nothing), the #engines and
    #processes panels, self.sampler, the #header."""

    prefs: Prefs
    prefs_path: Path | None
    prefs_note: str | None = None  # why the settings file was not used, shown once at start

    def apply_layout(self, layout: str) -> None:
        engines, processes = self.query_one("#engines"), self.query_one("#processes")  # type: ignore[attr-defined]
        engines.display = layout in ("engines", "stacked")
        processes.display = layout in ("processes", "stacked")
        # Stacked, Engines is as tall as its rows (up to a third) and the rest share what is left, so Processes,
        # Arena and Events stay on an 80x24 screen (issue 36: Engines took 14 blank rows and pushed them below).
        for panel in (engines, processes, self.query_one("#bottom")):  # type: ignore[attr-defined]
            panel.set_class(layout == "stacked", "stacked")
        focused = self.focused  # type: ignore[attr-defined]
        if focused is not None and not focused.display:
            (processes if processes.display else engines).focus()
        self.prefs = self.prefs.with_(layout=layout)

    def action_cycle_layout(self) -> None:
        layout = LAYOUTS[(LAYOUTS.index(self.prefs.layout) + 1) % len(LAYOUTS)]
        self.apply_layout(layout)
        if layout != "engines":
            self.query_one("#processes").focus()  # type: ignore[attr-defined]
        self.remember()
        self.notify(f"layout: {layout} (p changes it)", timeout=2)  # type: ignore[attr-defined]

    def action_set_refresh(self, seconds: float) -> None:
        sampler = self.sampler  # type: ignore[attr-defined]
        if sampler is not None:
            sampler.interval = seconds
            sampler.refresh_now()
        self.refresh_s = seconds  # type: ignore[attr-defined]
        header = self.query_one("#header")  # type: ignore[attr-defined]
        header.refresh_s = seconds
        self.prefs = self.prefs.with_(refresh=seconds)
        self.remember()
        self._show_header()  # type: ignore[attr-defined]

    def action_step_refresh(self, step: int) -> None:
        """+ and -: the next faster or slower of REFRESH_CHOICES (a rate in between goes to its neighbour)."""
        now = self.refresh_s  # type: ignore[attr-defined]
        if step < 0:
            choice = max((s for s in REFRESH_CHOICES if s < now), default=None)
        else:
            choice = min((s for s in REFRESH_CHOICES if s > now), default=None)
        if choice is None:
            edge = "fastest" if step < 0 else "slowest"
            self.notify(f"refresh every {now:g}s is already the {edge} (+ faster, - slower)",  # type: ignore
                        timeout=2)
            return
        self.action_set_refresh(choice)
        self.notify(f"refresh every {choice:g}s (remembered; + faster, - slower)", timeout=2)  # type: ignore

    def theme_changed(self, theme: str) -> None:
        if theme != self.prefs.theme:
            self.prefs = self.prefs.with_(theme=theme)
            self.remember()

    def remember(self) -> None:
        if self.prefs_path is None:
            return
        note = save(self.prefs, self.prefs_path)
        if note:
            self.notify(note, severity="warning")  # type: ignore[attr-defined]

    def layout_palette(self) -> list[tuple[str, str, str]]:
        out = [(f"Layout: {name}", {"engines": "engines in the middle", "processes": "GPU processes in the middle",
                                    "stacked": "engines and processes, one above the other"}[name],
                f"apply_named_layout('{name}')") for name in LAYOUTS]
        out += [(f"Refresh every {s:g}s", "how often the node is sampled (remembered)", f"set_refresh({s})")
                for s in REFRESH_CHOICES]
        return out

    def action_apply_named_layout(self, layout: str) -> None:
        self.apply_layout(layout)
        self.remember()
