"""Options every node-changing playbook command takes (--dry-run, --yes, --json, --wait), declared once.

Not a command module itself: drain, reset, purge and baseline import these annotated types; every command that
takes a GPU index or a count parses it with GPU_INDEX / COUNT.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable

import typer

from gpuwarden.ops.foundation.safetext import printable

DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask; required when there is no terminal "
                                    "(without it a script is refused, exit 1, and nothing changes).")]
JsonOut = Annotated[bool, typer.Option("--json", help="One JSON event per line.")]
Wait = Annotated[float, typer.Option("--wait", help="Seconds to wait for another playbook's lock on the GPU(s).")]
EndParents = Annotated[bool, typer.Option("--end-parents", help="Allow ending a process whose end takes down "
                                          "more than itself: a supervised engine, a container's PID 1 or a systemd "
                                          "unit's main process (as a zombie's parent or a holder). Without it the plan "
                                          "names them and only asks a parent to reap (SIGCHLD). Never PID 1 of the "
                                          "node.")]



def _plain_digits(what: str) -> Callable[[Any], int]:
    """A parser for a GPU index or a count: plain ASCII digits only, for every command that takes one.

    Typer's int is Python's int(), which also takes ' 1', a fullwidth '１', '+1' and '1_0': `drain ' 1' --yes`
    drained GPU 1 (issue 39). What is not digits 0-9 is refused, exit 2, naming the value."""
    def parse(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # a default from the code
        text = str(value)
        if not (text.isascii() and text.isdigit()) or len(text) > 9:
            raise typer.BadParameter(f"{printable(repr(text))} is not a {what}: write it in plain digits 0-9, e.g. 1")
        return int(text)
    return parse


GPU_INDEX = _plain_digits("GPU index")
COUNT = _plain_digits("count")
