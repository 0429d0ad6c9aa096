"""CLI: `gpuwarden purge` (placeholder until its issue lands).

Registers nothing yet.
"""

import typer


def register(app: typer.Typer) -> None:
    pass
