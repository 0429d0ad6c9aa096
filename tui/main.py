"""The `gpuwarden` program: the playbooks' CLI plus the console, which opens when no command is given.

`status` takes a fast path that loads neither Typer nor Textual (gpuwarden.playbooks.cli.fastcli); everything else loads the
full CLI. It lives in tui so that imports point down only (tui -> playbooks -> ops); `python -m gpuwarden.playbooks.cli.root`
is the same CLI without the console.
"""

from __future__ import annotations

import os
import sys

from gpuwarden.playbooks.cli import fastcli

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts here
if TYPE_CHECKING:
    import typer

    from gpuwarden.ops.foundation.settings import Settings


def build_cli() -> "typer.Typer":
    """The whole command line: the playbooks' commands, with the console (`tui`, and plain `gpuwarden`),
    `serve` and `fleet tui` added."""
    # `status` goes by playbooks.fastcli, without Typer or any command module
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (33.3 ms there)
    from gpuwarden.playbooks.cli import root as cli
    return cli.build_app(console=open_console,
                         commands={"tui": ("gpuwarden.tui.command:cli", "command"),
                                   "serve": ("gpuwarden.tui.serve:cli", "command")},
                         fleet_commands={"tui": ("gpuwarden.tui.fleet.command:cli", "command")})


def open_console(settings: "Settings") -> int | None:
    """Plain `gpuwarden`: the console (Textual loads here, not for a command)."""
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (30.9 ms there)
    from gpuwarden.tui.command import open_tui
    return open_tui(settings)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if "GPUWARDEN_SERVE_PID" in os.environ:  # a console `gpuwarden serve` started for a browser session
        # deferred: keeps `gpuwarden status --json` cheap (138.1 ms there); only a served console needs it
        from gpuwarden.tui.web_driver import die_with_serve
        die_with_serve()
    code = fastcli.run(args)
    if code is not None:
        return code
    # `status` goes by playbooks.fastcli, without Typer or any command module
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (33.3 ms there)
    from gpuwarden.playbooks.cli import root as cli
    return cli.main(args, build_cli())


if __name__ == "__main__":
    sys.exit(main())
