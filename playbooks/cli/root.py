"""The `gpuwarden` command line: global options, the command list, and one-line errors.

Each command lives in playbooks/cli/commands/<name>.py and registers itself on the app.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

try:  # newer typer vendors click; older releases depend on it
    from typer._click import ClickException  # type: ignore
    from typer._click.exceptions import NoArgsIsHelpError  # type: ignore
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import ClickException  # type: ignore
    from click.exceptions import NoArgsIsHelpError  # type: ignore

from gpuwarden.ops import __version__
from gpuwarden.ops.config import keys
from gpuwarden.ops.foundation import interrupts
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.settings import Settings

from gpuwarden.playbooks.cli.hints import Invocation
from gpuwarden.playbooks.cli.fastcli import guarded
from gpuwarden.playbooks.cli.globalopts import resolve
from gpuwarden.playbooks.cli.lazy import Interrupted, Lazy, LazyGroup, refuse_non_finite

# Every command, in the order of `gpuwarden --help`. Only the module of the command a line names is imported.
COMMANDS: Lazy = {
    "status": ("gpuwarden.playbooks.cli.commands.status:cli", "command"),
    "doctor": ("gpuwarden.playbooks.cli.commands.doctor:cli", "command"),
    "fix": ("gpuwarden.playbooks.cli.commands.fix:cli", "command"),
    "launch": ("gpuwarden.playbooks.cli.commands.launch:cli", "command"),
    "engines": ("gpuwarden.playbooks.cli.commands.engines:engines_app", "group"),
    "arena": ("gpuwarden.playbooks.cli.commands.arena:arena_app", "group"),
    "canary": ("gpuwarden.playbooks.cli.commands.canary:cli", "command"),
    "drain": ("gpuwarden.playbooks.cli.commands.drain:cli", "command"),
    "undrain": ("gpuwarden.playbooks.cli.commands.drain:cli", "command"),
    "reset": ("gpuwarden.playbooks.cli.commands.reset:cli", "command"),
    "purge": ("gpuwarden.playbooks.cli.commands.purge:cli", "command"),
    "baseline": ("gpuwarden.playbooks.cli.commands.baseline:baseline_app", "group"),
    "bundle": ("gpuwarden.playbooks.cli.commands.bundle:cli", "command"),
    "triage": ("gpuwarden.playbooks.cli.commands.triage:cli", "command"),
    "report": ("gpuwarden.playbooks.cli.commands.report:cli", "command"),
    "known": ("gpuwarden.playbooks.cli.commands.known:cli", "command"),
    "config": ("gpuwarden.playbooks.cli.commands.config:config_app", "group"),
    "journal": ("gpuwarden.playbooks.cli.commands.journal:cli", "command"),
    "agent": ("gpuwarden.playbooks.cli.commands.agent:cli", "command"),
    "k8s-agent": ("gpuwarden.playbooks.cli.commands.agent:cli", "command"),
    "history": ("gpuwarden.playbooks.cli.commands.history:cli", "command"),
    "metrics": ("gpuwarden.playbooks.cli.commands.metrics:cli", "command"),
    "sim": ("gpuwarden.playbooks.cli.commands.sim:sim_app", "group"),
    "gpu-check": ("gpuwarden.playbooks.cli.commands.k8s:cli", "command"),
    "post-clean": ("gpuwarden.playbooks.cli.commands.k8s:cli", "command"),
    "fleet": ("gpuwarden.playbooks.cli.commands.fleet:fleet_app", "group"),
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuwarden {__version__}")
        raise typer.Exit()


def _global(name: str, section: str = "global", **more: Any) -> Any:
    """A global option as the keys table declares it (ops/config/keys.py): its flag and its environment variable
    come from there, so the root, the loader and the docs' reference table cannot disagree."""
    k = keys.key(section, name)
    assert k.option is not None
    return typer.Option(k.option, envvar=k.env, show_default=False, **more)


StateDirOpt = Annotated[Optional[Path], _global(
    "state_dir", "", readable=False,  # statedir.check says it in one line
    help="Where gpuwarden keeps state (default /run/gpuwarden as root, $XDG_RUNTIME_DIR/gpuwarden otherwise).")]
ConfigOpt = Annotated[Optional[Path], _global(
    "config", readable=False,  # nodeconfig says it in one line
    help="Node config TOML (default /etc/gpuwarden/node.toml).")]
BackendOpt = Annotated[Optional[str], _global(
    "backend",
    help="GPU backend: amdsmi, sysfs, nvml or sim. Default, for every command: the first of amdsmi, sysfs, "
         "nvml that works, else an error naming why each failed; the simulated node (sim) only when named.")]
SysfsRootOpt = Annotated[Optional[Path], _global(
    "sysfs_root", help="Read this tree instead of /sys (a captured node).")]
ProcRootOpt = Annotated[Optional[Path], _global(
    "proc_root", help="Read this tree instead of /proc (a captured node).")]
ReadTimeoutOpt = Annotated[Optional[float], _global(
    "read_timeout", metavar="SECONDS",
    help="How long one read of a GPU source (a sysfs file, an amdsmi or NVML call) may take before that GPU "
         "is shown as STALE and named, and the command goes on without it (default 3; 0.05 to 600). A "
         "hung driver blocks such reads in the kernel.")]
VersionOpt = Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")]

def build_app(*, console: Callable[[Settings], int | None] | None = None, commands: Lazy | None = None,
              fleet_commands: Lazy | None = None) -> typer.Typer:
    """The whole command line, built anew on each call: the playbooks' commands, then what the caller adds
    (gpuwarden.tui.main adds the console as `tui` and as what plain `gpuwarden` does, `serve`, `fleet tui`), each
    named by "module:attribute" and imported only when used. Without a console, plain `gpuwarden` prints the help."""
    app = typer.Typer(
        cls=LazyGroup.with_commands({**COMMANDS, **(commands or {})}, nested={"fleet": fleet_commands or {}}),
        name="gpuwarden",
        help="Operations console for multi-GPU LLM inference nodes: see every GPU's memory and "
        "residual VRAM, supervise engines sharing a weight arena, and run playbooks "
        "(launch, drain, reset, purge, bundle). Run with no command to open the TUI.\n\n"
        "Exit status: 0 done or healthy; 1 needs attention, refused (a safety check, no --yes without a "
        "terminal) or a step failed; 2 error (bad input, missing file, no permission); 130 interrupted "
        "(143 by SIGTERM, 129 by SIGHUP: every command cleans up as it does for Ctrl-C), except that Ctrl-C "
        "is how `status --watch` and `journal --follow` end: the watch exits with its last view's 0 or 1, the "
        "follow with 0; and a simulated tenant (`sim hold`) ends on any of those signals with 0.",
        no_args_is_help=False,
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback(invoke_without_command=True)
    def _global(ctx: typer.Context, state_dir: StateDirOpt = None, config: ConfigOpt = None,
                backend: BackendOpt = None, sysfs_root: SysfsRootOpt = None, proc_root: ProcRootOpt = None,
                read_timeout: ReadTimeoutOpt = None, version: VersionOpt = False) -> None:
        invocation = _note_invocation(ctx, (("state_dir", "--state-dir"), ("config", "--config"),
                                            ("backend", "--backend"), ("sysfs_root", "--sysfs-root"),
                                            ("proc_root", "--proc-root"), ("read_timeout", "--read-timeout")))
        ctx.obj = resolve(state_dir, config, backend, sysfs_root, proc_root,
                          read_timeout).with_(cli_words=tuple(invocation.words))
        if ctx.invoked_subcommand is None:
            if console is None:
                typer.echo(ctx.get_help())
                raise typer.Exit(0)
            code = console(ctx.obj)
            if code:
                raise typer.Exit(code)

    return app


def _note_invocation(ctx: typer.Context, options: tuple[tuple[str, str], ...]) -> Invocation:
    """Record the global options given on the command line, so hints repeat them (gpuwarden.playbooks.cli.hints)."""
    invocation = ctx.obj if isinstance(ctx.obj, Invocation) else Invocation()
    for name, flag in options:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE" and ctx.params.get(name) is not None:
            invocation.words += [flag, str(ctx.params[name])]
    return invocation


def main(argv: list[str] | None = None, app: typer.Typer | None = None) -> int:
    """Entry point: run the app (the playbooks' own without one), turn expected failures into one line and an
    exit code."""
    args = argv if argv is not None else sys.argv[1:]
    app = app if app is not None else build_app()
    command = typer.main.get_command(app)  # a LazyGroup: the command the line names is imported when resolved
    invocation = Invocation()
    refuse_non_finite(command)  # the global options; each command's own when it loads
    interrupts.install()

    def call() -> int:
        try:
            rv = command.main(args=args, prog_name="gpuwarden", obj=invocation, standalone_mode=False)
            return rv if isinstance(rv, int) else 0
        except GpuwardenError as exc:
            exc.hint = invocation.paste_ready(exc.hint)  # the commands it names get this line's global options
            raise
        except Interrupted as exc:
            raise exc.interrupt from None
        except typer.Exit as exc:
            return exc.exit_code
        except typer.Abort:
            print("gpuwarden: aborted", file=sys.stderr)
            return 130
        except ClickException as exc:
            if isinstance(exc, NoArgsIsHelpError) and exc.ctx is not None:
                # a bare group (`gpuwarden engines`) asks for its help: print it as --help does
                typer.echo(exc.ctx.get_help())
                return 0
            # Click's own usage errors, in the same one-line shape as ours.
            print(f"gpuwarden: error: {printable(_plain_usage_message(exc))}", file=sys.stderr)
            option = getattr(exc, "option_name", None)
            if option in _GLOBAL_FLAGS:
                # A global option after the command: say where it goes, with this command line as it should be.
                value = "NAME" if option == "--backend" else "PATH"
                print(f"  hint: {option} is a global option: give it before the command "
                      f"(gpuwarden {option} {value} {_command_word(args)} ...)", file=sys.stderr)
            else:
                print("  hint: see `gpuwarden --help`, or `gpuwarden COMMAND --help`", file=sys.stderr)
            return exc.exit_code
        except SystemExit:
            # click answers a closed stdout (EPIPE) by pacifying the streams and exiting 1; the reader
            # going away (`| head`) is no failure, and 1 would read as "needs attention".
            if type(sys.stdout).__name__ == "PacifyFlushWrapper":
                return 0
            raise
    return guarded(call, "--json" in args)


_GLOBAL_FLAGS = ("--state-dir", "--config", "--backend", "--sysfs-root", "--proc-root")
_GLOBAL_WITH_VALUES = (*_GLOBAL_FLAGS, "--read-timeout")


def _command_word(args: list[str]) -> str:
    """The command named on the line (the first word that is not a global option or its value)."""
    i = 0
    while i < len(args):
        word = args[i]
        if word in _GLOBAL_WITH_VALUES:
            i += 2
            continue
        if not word.startswith("-"):
            return word
        i += 1
    return "COMMAND"


# What a value should have been, by the converter that refused it: pydantic's error types (typer >= 0.29 coerces
# through pydantic) and Click's parameter types (typer < 0.29, its own Click).
_KIND = {"int_parsing": "a whole number", "int_from_float": "a whole number", "float_parsing": "a number",
         "bool_parsing": "true or false", "int": "a whole number", "int range": "a whole number",
         "integer": "a whole number", "integer range": "a whole number", "float": "a number",
         "float range": "a number", "boolean": "true or false"}
_CLICK_REFUSED = re.compile(r"^'(?P<input>.*)' is not a valid ")


def _refused(exc) -> tuple[object, str] | None:
    """(the value given, what it should have been), from whichever converter refused it; None if not a number."""
    errors = getattr(exc.__cause__, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except (IndexError, TypeError, ValueError):
            return None
        kind = _KIND.get(first.get("type", ""), "")
        return (first.get("input"), kind) if kind else None
    kind = _KIND.get(getattr(getattr(getattr(exc, "param", None), "type", None), "name", ""), "")
    found = _CLICK_REFUSED.match(getattr(exc, "message", "") or "")
    return (found.group("input"), kind) if kind and found else None


def _plain_usage_message(exc) -> str:
    """Click's message, with the converter's wording ("Input should be a valid integer, unable to parse
    string as an integer", or "'abc' is not a valid int.") put as an operator reads it: "'abc' is not a GPU
    index (a whole number)"."""
    message = exc.format_message()
    refused = _refused(exc)
    if refused is None:
        return message
    given, kind = refused
    param = getattr(exc, "param", None)
    name = getattr(param, "name", "") or ""
    what = "a GPU index (`gpuwarden status` lists them)" if name in ("gpu", "gpus") else kind
    prefix = message.split(": ", 1)[0] if ": " in message else f"Invalid value for {name!r}"
    return f"{prefix}: {given!r} is not {what}"


if __name__ == "__main__":
    sys.exit(main())
