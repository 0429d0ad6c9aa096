"""gpuwarden's engine room: GPU backends, attribution, arena, supervision, bundles.

Nothing here imports Textual or Typer; `playbooks` and `tui` build on top of it.
"""

__version__ = "0.1.0"
