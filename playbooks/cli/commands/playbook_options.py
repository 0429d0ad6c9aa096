"""Options every node-changing playbook command takes (--dry-run, --yes, --json, --wait), declared once.

Not a command module itself: drain, reset, purge and baseline import these annotated types.
"""

from __future__ import annotations

from typing import Annotated

import typer

DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask; required when there is no terminal "
                                    "(without it a script is refused, exit 1, and nothing changes).")]
JsonOut = Annotated[bool, typer.Option("--json", help="One JSON event per line.")]
Wait = Annotated[float, typer.Option("--wait", help="Seconds to wait for another playbook's lock on the GPU(s).")]
