"""The fast path of the `gpuwarden` program: `status` without loading Typer, Textual or any other command.

`gpuwarden status --json` is what scripts and monitors run every few seconds; it must cost about as much as
starting Python. run() handles the arguments it fully understands and returns None for anything else
(--help, other commands, unknown options), which then goes to the full CLI.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

from gpuwarden.ops.foundation.paths import refuse_squatted
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.config.loader import state_dir as resolve_state_dir

# Global options that take a value, as the full CLI spells them.
_GLOBAL = {"--state-dir": "state_dir", "--config": "config", "--backend": "backend", "--sysfs-root": "sysfs_root",
           "--proc-root": "proc_root", "--read-timeout": "read_timeout"}
_PATHS = {"state_dir", "config", "sysfs_root", "proc_root"}


def _parse(argv: list[str]) -> tuple[dict, dict] | None:
    """(global options, status options) when argv is exactly `[globals] status [status options]`."""
    glob: dict[str, object] = {}
    opts: dict[str, object] = {"json_out": False, "watch": False, "interval": 2.0, "bundle": None}
    i = 0
    while i < len(argv) and argv[i] != "status":
        name, eq, value = argv[i].partition("=")
        if name not in _GLOBAL:
            return None
        if not eq:
            i += 1
            if i >= len(argv):
                return None
            value = argv[i]
        key = _GLOBAL[name]
        if key in glob or not value:
            return None  # leave odd input to the full CLI's messages
        glob[key] = Path(value) if key in _PATHS else value
        i += 1
    if i >= len(argv):
        return None
    for arg in argv[i + 1:]:
        if arg == "--json":
            opts["json_out"] = True
        else:
            return None  # --watch, --bundle, --interval, --help ...: the full CLI handles them
    return glob, opts


def print_error(exc, json_requested: bool) -> None:
    """A GpuwardenError as the CLI shows it: one line and a hint on stderr; the error document under --json."""
    # messages quote files and process names: no escapes reach a terminal
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (0.25 ms, 0.5 with loader's deadline)
    from gpuwarden.ops.foundation.safetext import printable
    for each in getattr(exc, "errors", None) or [exc]:  # a config with several errors lists them all
        print(f"gpuwarden: error: {printable(each.message)}", file=sys.stderr)
        if each.hint:
            print(f"  hint: {printable(each.hint)}", file=sys.stderr)
    if json_requested:
        # A script reading stdout gets the failure in the shape it parses (the exit code stays).
        # only an error needs it: `status --json` answered by the agent loads the socket client alone
        # deferred: keeps `gpuwarden status --json` answered by the agent cheap (0.2 ms there; 0.5 with printable's above)
        from gpuwarden.ops.foundation.jsondoc import dumps, error_document
        doc = error_document(exc.message, exc.hint, exc.exit_code)
        if getattr(exc, "errors", None):
            doc["errors"] = [{"error": e.message, "hint": e.hint} for e in exc.errors]
        sys.stdout.write(dumps(doc, indent=None) + "\n")


def print_os_error(exc: OSError) -> int:
    """An unexpected OSError (no permission, read-only or full file system) as one line; exit status 2."""
    where = f": {exc.filename}" if exc.filename else ""
    print(f"gpuwarden: error: {exc.strerror or exc}{where}", file=sys.stderr)
    print("  hint: check that path and its permissions (state lives in --state-dir / GPUWARDEN_STATE_DIR)",
          file=sys.stderr)
    return 2


class _AgentSettings:
    """What ops/sources/choose.py reads of the settings, for `status --json` answered by the agent: building
    Settings would load three more modules (records, deadline, settings) on the path scripts poll."""

    __slots__ = ("state_dir", "backend", "captured", "cli_words")

    def __init__(self, state_dir: Path, backend: str | None, captured: bool, cli_words: tuple[str, ...]):
        self.state_dir = state_dir
        self.backend = backend
        self.captured = captured
        self.cli_words = cli_words


def agent_settings(glob: dict[str, object]) -> _AgentSettings | None:
    """The settings the agent's cheap path needs, resolved from the global options and the environment without
    Settings; None when they need the full resolution (a node config of this command's own to validate, a state
    dir the config names that does not read). The state dir comes from the configuration loader's cheap state_dir()."""
    if glob.get("config") or os.environ.get("GPUWARDEN_CONFIG"):
        return None  # a config of this command's own: the full path validates it and checks it beside the agent
    state_dir = resolve_state_dir(glob)
    if state_dir is None:
        return None
    captured = bool(glob.get("sysfs_root") or glob.get("proc_root") or os.environ.get("GPUWARDEN_SYSFS_ROOT")
                    or os.environ.get("GPUWARDEN_PROC_ROOT"))
    if not captured:  # (a captured tree asks no agent: the chooser's rule 2)
        refuse_squatted(state_dir)  # a socket in a dir someone else made could serve anything
    backend = str(glob.get("backend") or os.environ.get("GPUWARDEN_BACKEND") or "")
    words = tuple(w for name, key in _GLOBAL.items() if key in glob for w in (name, str(glob[key])))
    return _AgentSettings(state_dir, backend if backend not in ("", "auto") else None, captured, words)


def _via_agent(glob: dict[str, object]) -> int | None:
    """`status --json` answered by the agent, its bytes untouched; None when the chooser says to take the full
    path (no agent serves this node as the command reads it)."""
    settings = agent_settings(glob)
    if settings is None:
        return None
    # only `status --json` asks the agent; every other command loads this module for guarded()
    # deferred: keeps every other command's start cheap (0.5 ms on `gpuwarden fix --help`)
    from gpuwarden.ops.sources.choose import raw, reply_exit_code
    reply = raw(settings)
    if reply is None:
        return None
    sys.stdout.buffer.write(reply.body + b"\n")
    sys.stdout.flush()
    return reply_exit_code(reply)


def run(argv: list[str]) -> int | None:
    """The exit status of a fast-path command, or None when argv is not one."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    glob, opts = parsed

    def status() -> int:
        if opts["json_out"]:
            code = _via_agent(glob)
            if code is not None:
                return code
        # when the agent answers, status needs neither
        # deferred: keeps `gpuwarden status --json` answered by the agent cheap (8.0 ms there)
        from gpuwarden.playbooks.cli import globalopts, statusview
        words = tuple(w for name, key in _GLOBAL.items() if key in glob for w in (name, str(glob[key])))
        settings = globalopts.resolve(**glob).with_(cli_words=words)  # type: ignore[arg-type]
        return statusview.run(settings, **opts)  # type: ignore[arg-type]
    # One shot: what it allocates goes with the process. The cycle collector's passes would cost ~1 ms while it
    # runs and ~4 ms at exit, where the interpreter's last collection walks every object left (of ~40 ms in all);
    # frozen objects are skipped there. Everything is still closed and flushed as usual.
    gc.disable()
    try:
        return guarded(status, bool(opts["json_out"]))
    finally:
        gc.freeze()
        gc.enable()


def guarded(call, json_requested: bool) -> int:
    """call()'s exit status, with the expected failures as one line each (the full CLI uses this too)."""
    try:
        return call()
    except GpuwardenError as exc:
        print_error(exc, json_requested)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        # Ctrl-C, or SIGTERM/SIGHUP once gpuwarden.ops.foundation.interrupts is installed: one line, 128 + the signal's number.
        # only an interrupt needs it; status does without
        # deferred: keeps `gpuwarden status --json` answered by the agent cheap (2.4 ms there)
        from gpuwarden.ops.foundation import interrupts
        print(f"gpuwarden: {interrupts.describe(exc)}", file=sys.stderr)
        return 128 + interrupts.signal_of(exc)
    except BrokenPipeError:
        return 0
    except OSError as exc:
        # Last line of defence for the expected ones (no permission, read-only or full file system,
        # a path under /proc): one line, never a traceback.
        return print_os_error(exc)
