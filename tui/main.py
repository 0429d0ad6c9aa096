"""The `gpuwarden` program: the playbooks' CLI plus the console, which opens when no command is given.

It lives in tui so that imports point down only (tui -> playbooks -> ops); `python -m playbooks.cli`
is the same CLI without the console.
"""

from __future__ import annotations

import sys

from playbooks import cli

from . import command, serve
from .fleet import command as fleet_command

command.register(cli.app)
fleet_command.register()
serve.register(cli.app)
cli.set_default_action(command.open_tui)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
