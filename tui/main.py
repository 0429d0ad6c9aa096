"""The `gpuwarden` program: the playbooks' CLI plus the console, which opens when no command is given.

`status` takes a fast path that loads neither Typer nor Textual (gpuwarden.playbooks.fastcli); everything else loads the
full CLI. It lives in tui so that imports point down only (tui -> playbooks -> ops); `python -m gpuwarden.playbooks.cli`
is the same CLI without the console.
"""

from __future__ import annotations

import sys


def full_cli():
    """The Typer app with the console, the fleet console and `serve` registered (and the no-command default)."""
    from gpuwarden.playbooks import cli

    from . import command, serve
    from .fleet import command as fleet_command
    if not getattr(cli.app, "_gpuwarden_tui", False):
        command.register(cli.app)
        fleet_command.register()
        serve.register(cli.app)
        cli.set_default_action(command.open_tui)
        cli.app._gpuwarden_tui = True  # type: ignore[attr-defined]
    return cli


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    from gpuwarden.playbooks import fastcli
    code = fastcli.run(args)
    if code is not None:
        return code
    return full_cli().main(args)


if __name__ == "__main__":
    sys.exit(main())
