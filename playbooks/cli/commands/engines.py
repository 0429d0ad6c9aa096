"""CLI: `gpuwarden engines` — list supervised engines, read or follow their logs, stop and restart them.

Reads the shims' state files; stop and restart go through the shim and re-check every pid before signalling.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Optional

import typer
from gpuwarden.playbooks.cli.commands.playbook_options import COUNT

from gpuwarden.playbooks.cli.commands import completion

from gpuwarden.ops.engines import state as st  # control, logs and registrations load in the commands that use them
from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.foundation.model import FAILED_REGISTRATION, plain, engine_ledger
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.jsondoc import document
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.engines import runtime_errors, logs

engines_app = typer.Typer(help="Supervised engines: list, logs, stop, restart.", no_args_is_help=True,
                          rich_markup_mode=None)


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj  # the CLI's global callback already applied the node config's state dir


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    s = max(0, time.time() - ts)
    return f"{s:.0f}s" if s < 120 else (f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h")


def _how(record: dict) -> str:
    if record.get("signal"):
        return record["signal"] + (" (core)" if record.get("core_dumped") else "")
    if record.get("exit_code") is not None:
        return f"code {record['exit_code']}"
    return "-"


def _record_or_empty(settings: Settings, name: str) -> dict:
    # list_engines already shows a corrupt record as stale; one bad file must not hide the other engines.
    try:
        return st.read_state(settings.state_dir, name) or {}
    except GpuwardenError:
        return {}


@engines_app.command("list")
def list_cmd(ctx: typer.Context,
             json_out: bool = typer.Option(False, "--json", help="Print the engines as a JSON list.")) -> None:
    """Every engine in the state dir: GPU, phase, pids, restarts, how it ended, the last log line.

    With progress = "preload", the KFD ledger too: bytes registered, pinned host memory (live, and the run's peak)
    and failed host calls, whose sum KFD charges against one node-wide system-memory limit; and that limit
    (debugfs kfd/mem_limit when readable, else computed from RAM, as the line says).

    An engine whose shim is gone while it claimed to be running shows as `stale`: its record is not
    to be trusted (the shim was killed, or the node rebooted).
    """
    # deferred: keeps `gpuwarden engines --help` cheap (36.2 ms there); only this path of the command needs it
    from gpuwarden.ops.arena import kfd_node
    # deferred: keeps `gpuwarden engines --help` cheap (0.8 ms there); only this path of the command needs it
    from gpuwarden.ops.engines import registrations
    settings = _settings(ctx)
    infos = st.list_engines(settings)
    if json_out:
        out = []
        for info in infos:
            record = _record_or_empty(settings, info.name)
            out.append({**plain(info), "detail": record.get("detail", ""), "phases": record.get("phases", {}),
                        "ledger": engine_ledger(info)})
        sys.stdout.write(json.dumps(document("engines", {"engines": out, "kfd": kfd_node.node_kfd(settings)}),
                                    indent=2) + "\n")
        return
    if not infos:
        typer.echo(f"no engines in {settings.state_dir} (start some with `gpuwarden launch`)")
        return
    rows = [("NAME", "GPU", "PHASE", "PID", "SHIM", "UP", "RESTARTS", "ENDED", "REGISTERED", "PINNED", "FAILED",
             "LAST LOG LINE")]
    for info in infos:
        record = _record_or_empty(settings, info.name)
        reg = registrations.latest(info.registrations)
        rows.append((info.name, "-" if info.gpu is None else str(info.gpu), info.phase, str(info.pid or "-"),
                     str(info.shim_pid or "-"), _age(info.started_at) if info.phase not in st.FINAL_PHASES else "-",
                     str(info.restarts), _how(record), registrations.describe(reg, short=True) if reg else "-",
                     _pinned(info), str(info.failed_call_count) if info.failed_call_count else "-",
                     (info.last_log_line or "")[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for info in infos:
        record = _record_or_empty(settings, info.name)
        if info.stale and not record:
            typer.echo(f"{info.name}: stale — its state file is unreadable; move "
                       f"{st.engine_dir(settings.state_dir, info.name) / st.STATE} aside")
        elif info.stale:
            typer.echo(f"{info.name}: stale — its shim (pid {info.shim_pid}) is gone; the record is not trusted")
        elif record.get("detail") and info.phase in ("crashed", "stopping", "waiting", FAILED_REGISTRATION):
            typer.echo(f"{info.name}: {printable(str(record['detail']))}")
        if info.bundle:
            typer.echo(f"{info.name}: incident bundle {printable(info.bundle)} "
                       f"(read it with `gpuwarden triage {printable(info.bundle)}`)")
        if record.get("warning"):
            typer.echo(f"{info.name}: {printable(str(record['warning']))}")
        for reg in info.registrations[-3:]:
            if reg.kind == "register":
                typer.echo(printable(f"{info.name}: {reg.call or 'registration'} {registrations.describe(reg)}"
                                     + (f" (pid {reg.pid}, via {reg.via})" if reg.via else "")))
        for call in info.failed_calls[-3:]:
            if call.kind != "register":  # failed registrations are the lines above
                typer.echo(printable(f"{info.name}: {_failed(call)}"))
    kfd = kfd_node.node_kfd(settings)
    registered = sum(e.registered_bytes or 0 for e in infos if e.phase not in st.FINAL_PHASES and not e.stale)
    pinned = sum(e.pinned_bytes or 0 for e in infos if e.phase not in st.FINAL_PHASES and not e.stale)
    typer.echo(printable(kfd_node.describe(kfd)))
    if registered or pinned:
        typer.echo(f"running engines: {fmt_bytes(registered)} registered + {fmt_bytes(pinned)} pinned = "
                   f"{fmt_bytes(registered + pinned)} charged by KFD (each process's registrations and pinned "
                   "host memory count once against that limit)")


def _pinned(info) -> str:
    """'2.0 GiB (peak 8.0 GiB)': the engine's pinned host memory now and at the run's peak; '-' when unreported."""
    if info.host_ledger is None:
        return "-"
    now, peak = info.host_ledger.pinned_bytes, info.host_ledger.peak_bytes
    return fmt_bytes(now) + (f" (peak {fmt_bytes(peak)})" if peak > now else "")


def _failed(call) -> str:
    """'hipHostMalloc of 8.0 GiB FAILED: hipErrorOutOfMemory (2), flags 0x3 (pid 412, via symbol)'."""
    what = f"{call.call or 'host call'} of {fmt_bytes(call.bytes)}" if call.kind == "alloc" else \
        f"{call.call or 'host free'} ({fmt_bytes(call.bytes)} on the books)"
    flags = f", flags {call.flags:#x}" if call.flags is not None else ""
    where = f" (pid {call.pid}" + (f", via {call.via})" if call.via else ")") if call.pid else ""
    return f"{what} FAILED: {runtime_errors.describe(call.call, call.result)}{flags}{where}"


@engines_app.command("logs")
def logs_cmd(ctx: typer.Context, name: str = typer.Argument(..., help="Engine name.", autocompletion=completion.engines),
             lines: int = typer.Option(50, "--lines", "-n", min=0, parser=COUNT, help="How many last lines to show."),
             follow: bool = typer.Option(False, "--follow", "-f",
                                         help="Keep printing new lines until Ctrl-C (or the engine has ended).")) -> None:
    """Print an engine's stdout and stderr (the shim keeps them, size-capped, in the state dir)."""
    settings = _settings(ctx)
    path = st.engine_dir(settings.state_dir, name) / st.LOG
    if not st.engine_dir(settings.state_dir, name).is_dir():
        raise NotFound(f"no engine named {name!r} in {settings.state_dir}", "see `gpuwarden engines list`")
    if not follow:
        for line in st.tail(path, lines, limit=max(65536, lines * 512)):
            typer.echo(line)
        return
    quiet_since = [time.monotonic()]

    def keep_going() -> bool:
        record = st.read_state(settings.state_dir, name) or {}
        ended = record.get("phase") in st.FINAL_PHASES or st.is_stale(record, settings.proc_root)
        return not (ended and time.monotonic() - quiet_since[0] > 1.0)

    for line in logs.follow(path, from_end_lines=lines, keep_going=keep_going):
        quiet_since[0] = time.monotonic()
        typer.echo(line)
        sys.stdout.flush()


@engines_app.command("stop")
def stop_cmd(ctx: typer.Context, name: Optional[str] = typer.Argument(None, help="Engine name.",
                                                  autocompletion=completion.engines),
             all_: bool = typer.Option(False, "--all", help="Stop every running engine."),
             timeout: Optional[float] = typer.Option(None, "--timeout", min=0,
                                                     help="Grace before SIGKILL (default: the engine's stop_grace)."),
             json_out: bool = typer.Option(False, "--json", help="Print what was done as JSON."),
             yes: bool = typer.Option(False, "--yes", "-y", help="With --all: do not ask; required when there is "
                                      "no terminal (without it a script is refused, exit 2, and nothing stops).")
             ) -> None:
    """Stop an engine through its shim: its stop signal, the grace, then SIGKILL.

    With --all, the processes it would signal (every engine and its shim: pid, user, command, signals)
    are listed and it asks first, like `gpuwarden drain`; scripts pass --yes.

    Every signal re-checks the target's pid and start time first, so a reused pid is never signalled;
    each is written to the journal. When the shim is gone the engine is signalled directly, with the
    same checks.
    """
    settings = _settings(ctx)
    if bool(name) == all_:
        raise GpuwardenError("name one engine or pass --all", "e.g. gpuwarden engines stop dp0")
    infos = st.list_engines(settings)
    if name:
        known = {i.name: i for i in infos}
        targets = ((name, known[name].gpu if name in known else None),)
    else:
        targets = tuple((i.name, i.gpu) for i in infos if i.phase not in st.FINAL_PHASES)
    results = []
    if targets:
        # deferred: keeps `gpuwarden engines --help` cheap (10.4 ms there); only this path of the command needs it
        from gpuwarden.playbooks.framework import run
        # deferred: keeps `gpuwarden engines --help` cheap (23.4 ms there)
        from gpuwarden.playbooks.stop import StopEnginePlaybook
        pb = StopEnginePlaybook(engines=targets, timeout_s=timeout)
        if name or yes:
            # Naming one engine is the operator's confirmation; the runner adds locks and journal.
            outcome = run(pb, settings, assume_yes=True)
        else:
            # deferred: keeps `gpuwarden engines --help` cheap (11.0 ms there)
            from gpuwarden.playbooks.cli.output import event_printer, terminal_confirm
            confirm = None if json_out else terminal_confirm()
            names = ", ".join(n for n, _ in targets)
            if confirm is None:
                raise GpuwardenError(f"engines stop --all needs confirmation and there is no terminal to ask on: "
                                     f"nothing was stopped (running: {names})",
                                     "pass --yes to stop every running engine from a script, or name one engine")
            printer = event_printer(False, settings.cli_words)
            outcome = run(pb, settings, confirm=confirm,
                          sink=lambda e: printer(e) if e.kind == "planned" else None)
            if outcome.refused == "cancelled":
                typer.echo("cancelled: no engine was stopped", err=True)
                raise typer.Exit(1)
        if outcome.refused:
            raise GpuwardenError(outcome.refused, "see `gpuwarden engines list` for the engines there are")
        results = outcome.data.get("results", [])
    if json_out:
        doc = document("engine-actions", {"action": "stop", "results": [dataclasses.asdict(r) for r in results]})
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    if not results:
        typer.echo("no running engines")
    for r in results:
        typer.echo(f"{r.name}: {r.result}" + (f" — {r.detail}" if r.detail else ""))


@engines_app.command("restart")
def restart_cmd(ctx: typer.Context, name: str = typer.Argument(..., help="Engine name.", autocompletion=completion.engines),
                timeout: Optional[float] = typer.Option(None, "--timeout", min=0,
                                                        help="Grace before SIGKILL when stopping it.")) -> None:
    """Stop an engine (if it runs) and start it again under a new shim, with the spec it was launched with."""
    # deferred: keeps `gpuwarden engines --help` cheap (15.2 ms there); only this path of the command needs it
    from gpuwarden.ops.engines import control
    settings = _settings(ctx)
    shim_pid = control.restart(settings, name, timeout_s=timeout)
    control.wait_for_record(settings, name, shim_pid)
    typer.echo(f"{name}: restarted under shim {shim_pid} (follow it with `gpuwarden engines list`)")
