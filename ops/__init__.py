"""gpuwarden's engine room: GPU backends, attribution, arena, supervision, bundles.

Nothing here imports Textual or Typer; `playbooks` and `tui` build on top of it.
"""

# The one place the version is written: the wheel, `gpuwarden --version`, the image tag and /healthz read it.
__version__ = "0.3.0"
