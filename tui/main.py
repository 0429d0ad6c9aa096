"""The `gpuwarden` program: the playbooks' CLI plus the console, which opens when no command is given.

`status` takes a fast path that loads neither Typer nor Textual (gpuwarden.playbooks.cli.fastcli); everything else loads the
full CLI. It lives in tui so that imports point down only (tui -> playbooks -> ops); `python -m gpuwarden.playbooks.cli.root`
is the same CLI without the console.
"""

from __future__ import annotations

import os
import sys

from gpuwarden.playbooks.cli import fastcli


def build_cli():
    """The whole command line: the playbooks' commands, with the console (`tui`, and plain `gpuwarden`),
    `serve` and `fleet tui` added."""
    # deferred: `status` goes by playbooks.fastcli, without Typer or any command module
    from gpuwarden.playbooks.cli import root as cli

    from gpuwarden.tui import command, serve
    from gpuwarden.tui.fleet import command as fleet_command
    return cli.build_app(console=command.open_tui, commands=(command.register, serve.register),
                         fleet_commands=(fleet_command.register,))


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if "GPUWARDEN_SERVE_PID" in os.environ:  # a console `gpuwarden serve` started for a browser session
        from gpuwarden.tui.web_driver import die_with_serve  # deferred: only a served console needs it
        die_with_serve()
    code = fastcli.run(args)
    if code is not None:
        return code
    # deferred: `status` goes by playbooks.fastcli, without Typer or any command module
    from gpuwarden.playbooks.cli import root as cli
    return cli.main(args, build_cli())


if __name__ == "__main__":
    sys.exit(main())
