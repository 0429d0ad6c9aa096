"""CLI: `gpuwarden fleet ...` — many nodes from one terminal over SSH (status, playbooks, bundles).

Nodes come from --hosts, --hosts-from/--group, --nodelist or fleet.hosts; ~/.ssh/config says how to reach them.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from gpuwarden.playbooks.cli.commands.playbook_options import GPU_INDEX

from gpuwarden.ops.foundation import extras
from gpuwarden.ops.fleet.hostlist import MAX_HOSTS
from gpuwarden.ops.foundation.jsondoc import dumps
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.units import parse_duration
from gpuwarden.playbooks.cli.lazy import LazyGroup

fleet_app = typer.Typer(
    cls=LazyGroup, name="fleet", no_args_is_help=True, rich_markup_mode=None,  # the console adds `fleet tui`
    help="Many nodes over SSH with your own ~/.ssh/config, keys and known_hosts: `fleet status` (one table, "
         "worst node first), `fleet tui`, and the node playbooks run remotely (purge, drain, undrain, baseline, "
         "bundle). Each node runs its own gpuwarden with its own locks and journal.")

HostsFile = Annotated[Optional[Path], typer.Option(
    "--hosts", metavar="FILE", help="One [user@]host[:port] per line; # starts a comment; gpu[01-16] ranges allowed. "
                                    "Lines for one address on other ports or for other users are other nodes; an "
                                    "identical line is a duplicate (warned, asked once). A regular file of at most "
                                    "4 MiB.")]
HostsFrom = Annotated[Optional[Path], typer.Option(
    "--hosts-from", metavar="INVENTORY", help="An Ansible INI inventory (ansible_host/_port/_user are honoured); "
                                              "a regular file of at most 4 MiB.")]
Group = Annotated[Optional[str], typer.Option(
    "--group", help="The inventory group to take with --hosts-from (default: all hosts).")]
Nodelist = Annotated[Optional[str], typer.Option(
    "--nodelist", metavar="HOSTLIST", help="Slurm hostlist syntax, e.g. 'gpu[01-16],gpu-b[1-4]'. A fleet command "
                                           f"takes at most {MAX_HOSTS:,} hosts in all (--hosts, --hosts-from and "
                                           "--nodelist together): ranges are counted before they are expanded.")]
FleetConfigOpt = Annotated[Optional[Path], typer.Option(
    "--fleet-config", metavar="FILE", envvar="GPUWARDEN_FLEET_CONFIG",
    help="Fleet config TOML with a [fleet] table: hosts, command, parallel, timeout, prometheus, "
         "prometheus_selector, prometheus_max_age "
         "(default ~/.config/gpuwarden/fleet.toml, else /etc/gpuwarden/fleet.toml).")]
SshConfig = Annotated[Optional[Path], typer.Option(
    "--ssh-config", "-F", metavar="FILE",
    help="OpenSSH client config to use instead of ~/.ssh/config (Host aliases, User, Port, IdentityFile, "
         "ProxyJump, UserKnownHostsFile).")]
AcceptNew = Annotated[bool, typer.Option(
    "--accept-new", help="Add the host key of a node never seen before to known_hosts (as OpenSSH's "
                         "StrictHostKeyChecking=accept-new); a changed host key is always refused.")]
Parallel = Annotated[Optional[int], typer.Option(
    "--parallel", min=1, help="Nodes contacted at once (default 32, or fleet.parallel).")]
Timeout = Annotated[Optional[float], typer.Option(
    "--timeout", help="Seconds each node may take, connection included (default 15, or fleet.timeout).")]
RemoteCommand = Annotated[Optional[str], typer.Option(
    "--remote-command", metavar="CMD", help="How to start gpuwarden on a node (default `gpuwarden`, or "
                                            "fleet.command), e.g. 'sudo -n /opt/gpuwarden/bin/gpuwarden'.")]


Prometheus = Annotated[Optional[str], typer.Option(
    "--prometheus", metavar="URL", envvar="GPUWARDEN_PROMETHEUS",
    help="Read the fleet from this Prometheus (the series each node's `gpuwarden agent --metrics-listen` exports) "
         "and over SSH only the nodes whose series are missing or stale; without an inventory, the fleet is every "
         "node with gpuwarden series (default fleet.prometheus; '' turns it off). A bearer token goes in "
         "$GPUWARDEN_PROMETHEUS_TOKEN, basic auth in the URL.")]
PromSelector = Annotated[Optional[str], typer.Option(
    "--prometheus-selector", metavar="MATCHERS",
    help="Label matchers added to every query, e.g. 'job=\"gpuwarden\",cluster=\"b\"' (default "
         "fleet.prometheus_selector). A node is matched by its instance label (port aside) or hostname label.")]
PromMaxAge = Annotated[Optional[float], typer.Option(
    "--prometheus-max-age", metavar="SECONDS",
    help="Series older than this (scrape age plus the agent's snapshot age) are stale: that node is read over "
         "SSH (default 60, or fleet.prometheus_max_age; raise it for scrape intervals over 30s).")]

# Every fleet command takes these; `with_fleet_target` adds them to its signature and resolves them once.
INVENTORY = (("hosts", HostsFile, None), ("hosts_from", HostsFrom, None), ("group", Group, None),
             ("nodelist", Nodelist, None), ("fleet_config", FleetConfigOpt, None), ("ssh_config", SshConfig, None),
             ("accept_new", AcceptNew, False), ("parallel", Parallel, None), ("timeout", Timeout, None),
             ("remote_command", RemoteCommand, None))
# The commands that only read (status, tui) may read Prometheus first.
PROMETHEUS = (("prometheus", Prometheus, None), ("prometheus_selector", PromSelector, None),
              ("prometheus_max_age", PromMaxAge, None))


def _fleet_target_decorator(options_spec: tuple, reads_prometheus: bool):
    def decorate(func):
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "fleet_target"]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
                 for name, annotation, default in options_spec]

        @functools.wraps(func)
        def command(*args, **kwargs):
            # deferred: keeps `gpuwarden fleet --help` cheap (47.4 ms there); only this path of the command needs it
            from gpuwarden.playbooks.fleet.target import resolve
            options = {name: kwargs.pop(name) for name, _, _ in options_spec}
            target = kwargs["fleet_target"] = resolve(hosts_file=options.pop("hosts"),
                                                      reads_prometheus=reads_prometheus, **options)
            if target.prometheus is None:  # SSH to every node (with Prometheus, only to those it lacks)
                extras.need("fleet", f"fleet {func.__name__.removeprefix('fleet_').removesuffix('_cmd')}")
            warning = target.duplicates_warning()
            if warning:  # on stderr whatever the output: `fleet status --json` also lists them in its document
                typer.echo(f"gpuwarden: warning: {warning}", err=True)
            return func(*args, **kwargs)

        command.__signature__ = sig.replace(parameters=[*own, *added])
        return command
    return decorate


# Give a command the inventory and SSH options (and Prometheus's, for one that reads); it receives them resolved
# as `fleet_target` (a FleetTarget).
with_fleet_target = _fleet_target_decorator(INVENTORY, reads_prometheus=False)
with_fleet_view = _fleet_target_decorator(INVENTORY + PROMETHEUS, reads_prometheus=True)


class Progress:
    """`12/16 nodes answered` on a terminal's stderr while a fan-out runs; nothing into a pipe."""

    def __init__(self, total: int | None, what: str = "answered"):
        self.total, self.done, self.what = total, 0, what  # total None: not known yet (nodes from Prometheus)
        self.live = sys.stderr.isatty()

    def __call__(self, _row=None) -> None:
        self.done += 1
        if self.live:
            of = f"/{self.total}" if self.total else ""
            sys.stderr.write(f"\r{self.done}{of} nodes {self.what}\x1b[K")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.live:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


@fleet_app.command("status")
@with_fleet_view
def status_cmd(
    fleet_target=None,
    json_out: bool = typer.Option(False, "--json", help="Print the fleet as one JSON document (gpuwarden.fleet-status/1)."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", min=1.0, help="Seconds between refreshes with --watch."),
    history: Optional[str] = typer.Option(
        None, "--history", metavar="DURATION",
        help="With --prometheus: each node's last DURATION (30m, 6h) too: a trend of its residual VRAM and the "
             "engine crashes and kernel errors in that time."),
) -> None:
    """Every node's status in one table, worst node first: GPUs, residual VRAM and its holders, engines
    serving/crashed, drained GPUs, agent, backend (SIMULATED nodes marked), where the row came from
    (prometheus, ssh or unreachable), and the reason for each node that could not be reached.

    Over SSH each node answers with its own `gpuwarden status --json` (its agent's snapshot when one runs).

    Exit status: the worst node's — 0 all healthy, 1 some need attention, 2 some could not be seen.
    """
    # deferred: keeps `gpuwarden fleet --help` cheap (27.7 ms there); only this path of the command needs it
    from gpuwarden.ops.fleet import summary
    # deferred: keeps `gpuwarden fleet --help` cheap (45.8 ms there)
    from gpuwarden.playbooks.fleet.status import collect
    t = fleet_target
    history_s = _history_window(history, t)
    try:
        while True:
            progress = Progress(len(t.hosts) or None)
            started = time.monotonic()
            rows, prom = collect(t, progress if not watch else None, history_s=history_s)
            progress.clear()
            if prom and prom["error"] and not json_out:
                typer.echo(f"gpuwarden: warning: {prom['error']}; every node read over SSH", err=True)
            if json_out:
                doc = summary.document(rows, duration_s=time.monotonic() - started, prometheus=prom,
                                       duplicates=[d.to_dict() for d in t.duplicates])
                sys.stdout.write(dumps(doc, indent=None if watch else 2) + "\n")
            else:
                text = summary.table(rows)
                if watch:
                    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
                    text = clear + text + f"\n\n(every {interval:g}s, took {time.monotonic() - started:.1f}s, Ctrl-C to stop)"
                sys.stdout.write(text + "\n")
            sys.stdout.flush()
            if not watch:
                raise typer.Exit(summary.exit_code(rows))
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass


def _history_window(text: str | None, t) -> float | None:
    if text is None:
        return None
    if t.prometheus is None:
        raise GpuwardenError("--history needs Prometheus", "add --prometheus URL (or set fleet.prometheus)")
    seconds = parse_duration(text)
    if seconds < 60:
        raise GpuwardenError(f"--history {text} is too short", "give a minute or more, e.g. --history 1h")
    return seconds


DryRun = Annotated[bool, typer.Option("--dry-run", help="Show each node's plan; change nothing anywhere.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask; required without a terminal (a destructive "
                                   "playbook is refused otherwise, exit 1, and no node is touched).")]
JsonOut = Annotated[bool, typer.Option("--json", help="One JSON line per node event (gpuwarden.fleet-event/1).")]


def run_playbook(t, rp, *, dry_run: bool, yes: bool, json_out: bool) -> int:
    """Plan or run `rp` on every node: ask once for the whole set when it is destructive; exit the worst node's."""
    # deferred: keeps `gpuwarden fleet --help` cheap (160.2 ms there); only this path of the command needs it
    from gpuwarden.playbooks.fleet import actions
    # deferred: keeps `gpuwarden fleet --help` cheap (14.3 ms there)
    from gpuwarden.playbooks.cli.output import event_printer
    names = [h.name for h in t.hosts]
    if rp.destructive and not dry_run and not yes:
        if json_out or not (sys.stdin.isatty() and sys.stdout.isatty()):
            typer.echo(f"fleet {rp.name}: refused: {rp.title} on {len(names)} node(s) changes them and there is no "
                       "terminal to ask on; pass --yes to run it from a script (nothing was touched)", err=True)
            return 1
        typer.echo(f"{rp.title} on {len(names)} node(s): {', '.join(names)}")
        if not typer.confirm("Proceed on all of them?", default=False):
            typer.echo("cancelled: no node was touched", err=True)
            return 1
    width = max(len(n) for n in names)
    printers = {n: event_printer(False, prefix=f"{n.ljust(width)} | ") for n in names}

    def on_event(host, event) -> None:
        if json_out:
            sys.stdout.write(dumps(actions.fleet_event(host.name, event=event), indent=None) + "\n")
            sys.stdout.flush()
        elif not dry_run or event.get("kind") in ("planned", "info"):
            printers[host.name](actions.event_from_dict(event))

    def on_node(run) -> None:
        if json_out:
            line = actions.fleet_event(run.host.name, exit_code=run.exit_code, error=run.error, hint=run.hint)
            sys.stdout.write(dumps(line, indent=None) + "\n")
            sys.stdout.flush()
        elif run.error:
            typer.echo(f"{run.host.name.ljust(width)} | UNREACHABLE: {run.error}", err=True)

    runs = actions.run_on_fleet(t, rp, dry_run=dry_run, on_event=on_event, on_node=on_node)
    code = actions.exit_code(runs)
    if not json_out:
        typer.echo("")
        verdict = {0: "ok", 1: "refused or failed", 2: "error", 130: "interrupted"}
        for run in runs:
            typer.echo(f"{run.host.name.ljust(width)}  {verdict.get(run.exit_code, 'error'):<17} {run.done_message}")
            if run.hint:
                typer.echo(f"{' ' * width}  hint: {run.hint}")
        ok = sum(1 for r in runs if r.exit_code == 0)
        typer.echo(f"fleet {rp.name}{' (dry run)' if dry_run else ''}: {ok}/{len(runs)} node(s) ok")
    return code


@fleet_app.command("purge")
@with_fleet_target
def purge_cmd(
    gpu: Optional[int] = typer.Argument(None, parser=GPU_INDEX, help="GPU index on every node; every GPU when left out."),
    fleet_target=None,
    dry_run: DryRun = False, yes: Yes = False, json_out: JsonOut = False,
) -> None:
    """Run each node's own `gpuwarden purge [GPU]`: remove what holds residual VRAM, with the node's checks,
    locks and journal (which records you and that it came from the fleet). Asks once for the whole set."""
    # deferred: keeps `gpuwarden fleet --help` cheap (160.2 ms there); only this path of the command needs it
    from gpuwarden.playbooks.fleet import actions
    t = fleet_target
    raise typer.Exit(run_playbook(t, actions.purge(gpu), dry_run=dry_run, yes=yes, json_out=json_out))


@fleet_app.command("drain")
@with_fleet_target
def drain_cmd(
    gpu: int = typer.Argument(..., parser=GPU_INDEX, help="GPU index to drain on every node."),
    reason: str = typer.Option("", "--reason", help="Why, for each node's journal and status."),
    fleet_target=None,
    dry_run: DryRun = False, yes: Yes = False, json_out: JsonOut = False,
) -> None:
    """Run each node's own `gpuwarden drain GPU`: mark it drained, stop its engines, wait until it is idle.
    Asks once for the whole set."""
    # deferred: keeps `gpuwarden fleet --help` cheap (160.2 ms there); only this path of the command needs it
    from gpuwarden.playbooks.fleet import actions
    t = fleet_target
    raise typer.Exit(run_playbook(t, actions.drain(gpu, reason), dry_run=dry_run, yes=yes, json_out=json_out))


@fleet_app.command("undrain")
@with_fleet_target
def undrain_cmd(
    gpu: int = typer.Argument(..., parser=GPU_INDEX, help="GPU index to put back in service on every node."),
    fleet_target=None,
    dry_run: DryRun = False, yes: Yes = False, json_out: JsonOut = False,
) -> None:
    """Run each node's own `gpuwarden undrain GPU`."""
    # deferred: keeps `gpuwarden fleet --help` cheap (160.2 ms there); only this path of the command needs it
    from gpuwarden.playbooks.fleet import actions
    t = fleet_target
    raise typer.Exit(run_playbook(t, actions.undrain(gpu), dry_run=dry_run, yes=yes, json_out=json_out))


@fleet_app.command("baseline")
@with_fleet_target
def baseline_cmd(
    gpu: Optional[int] = typer.Argument(None, parser=GPU_INDEX, help="GPU index; every GPU when left out."),
    fleet_target=None,
    dry_run: DryRun = False, yes: Yes = False, json_out: JsonOut = False,
) -> None:
    """Run each node's own `gpuwarden baseline record [GPU]` (on idle nodes: the idle VRAM per GPU)."""
    # deferred: keeps `gpuwarden fleet --help` cheap (160.2 ms there); only this path of the command needs it
    from gpuwarden.playbooks.fleet import actions
    t = fleet_target
    raise typer.Exit(run_playbook(t, actions.baseline(gpu), dry_run=dry_run, yes=yes, json_out=json_out))


@fleet_app.command("bundle")
@with_fleet_target
def bundle_cmd(
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="DIR",
                                          help="New directory for the bundles (default ./fleet-bundle-<time>/)."),
    safe_mode: bool = typer.Option(False, "--safe-mode", help="Each node skips vendor tools that can hang."),
    since: Optional[str] = typer.Option(None, "--since", help="Only log lines from the last DURATION (30m, 2h)."),
    fleet_target=None,
    json_out: bool = typer.Option(False, "--json", help="Print the index (gpuwarden.fleet-bundle/1) as JSON."),
) -> None:
    """Each node collects its own incident bundle (`gpuwarden bundle`); every bundle is pulled back over SFTP
    into one directory with index.json, index.md and a fleet triage: the same fault signature on several
    nodes (the same Xid on 5 nodes, the same libamdhip64 offset on 3) is listed first.

    Exit status: 0 every node's bundle pulled, 2 some could not be collected.
    """
    # deferred: keeps `gpuwarden fleet --help` cheap (160.6 ms there); only this path of the command needs it
    from gpuwarden.playbooks.fleet import bundles
    t = fleet_target
    out_dir = bundles.make_output_dir(output)
    args = (("--safe-mode",) if safe_mode else ()) + (("--since", since) if since else ())
    progress = Progress(len(t.hosts), "collected")
    pulled = bundles.pull_all(t, out_dir, args, on_node=progress)
    progress.clear()
    groups = bundles.fleet_triage(pulled)
    doc = bundles.write_index(out_dir, pulled, groups)
    if json_out:
        sys.stdout.write(dumps(doc) + "\n")
    else:
        typer.echo(f"fleet bundle: {out_dir}")
        for p in pulled:
            typer.echo(f"  {p.host.name}: " + (f"{p.local_path.name} ({p.bytes} bytes)" if p.local_path
                                               else f"NOT COLLECTED: {p.error}"))
        typer.echo("fleet triage:")
        for g in groups[:20]:
            typer.echo(f"  - {g['title']}")
        if not groups:
            typer.echo("  - no findings in the kernel logs")
    raise typer.Exit(2 if any(p.error for p in pulled) else 0)
