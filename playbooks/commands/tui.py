"""CLI: `gpuwarden tui` opens the live console (also what plain `gpuwarden` does).

The TUI is imported only here, so scripted commands never pay for Textual.
"""

from __future__ import annotations

import typer

from ops.settings import Settings


def open_tui(settings: Settings) -> None:
    from tui.app import GpuwardenApp
    GpuwardenApp(settings).run()


def register(app: typer.Typer) -> None:
    @app.command("tui")
    def tui_cmd(ctx: typer.Context) -> None:
        """Open the live console (GPUs, residual VRAM, engines, arena, playbooks)."""
        open_tui(ctx.obj)
