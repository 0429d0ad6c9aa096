"""CLI: `gpuwarden agent` — the node agent: sample continuously, keep history and events, serve the local API.

Runs in the foreground under systemd (Type=notify) or with --foreground; from a terminal it detaches and says
where it listens. `agent start|stop|status|restart` manage a detached one, found by the lock it holds
(ops/agent/running.py). --install-systemd writes its unit (a dry run unless --yes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer

try:  # newer typer vendors click; older releases depend on it
    from typer._click.core import ParameterSource  # type: ignore
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.core import ParameterSource  # type: ignore

from gpuwarden.ops.foundation import extras
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.config.keys import MIN_REFRESH_S
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.statedir import ensure
from gpuwarden.ops.foundation.units import parse_duration

from gpuwarden.playbooks.cli.commands.playbook_options import JsonOut, Yes
from gpuwarden.ops.config import loader
from gpuwarden.ops.config.loader import kubernetes_config as for_settings


def _config(settings: Settings, interval: float | None):
    return loader.agent_config(settings, interval=interval)  # table defaults < [agent] < --interval


def _sampler(settings: Settings):
    """The agent's sampler. An agent on the automatic sim fallback would serve a fake node as if it were this
    one: without a real backend (or --backend sim) it refuses, exit 2."""
    # deferred: keeps `gpuwarden agent --help` cheap (1.9 ms there); only this path of the command needs it
    from gpuwarden.ops.node.backends.select import open_backend
    # deferred: keeps `gpuwarden agent --help` cheap (6.5 ms there)
    from gpuwarden.ops.sampling.sampler import Sampler
    return Sampler(settings, open_backend(settings))


def _detach(settings: Settings, argv: list[str]) -> int:
    """Start the agent as a daemon (its log in the state dir) and wait until it answers or fails."""

    # deferred: keeps `gpuwarden agent --help` cheap (2.3 ms there); only this path of the command needs it
    from gpuwarden.ops.agent.client import get
    # deferred: keeps `gpuwarden agent --help` cheap (74.6 ms there)
    from gpuwarden.ops.services.agent_daemon import agent_dir, socket_path
    ensure(settings.state_dir, "agent")
    log = agent_dir(settings.state_dir) / "agent.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", *argv, "--foreground"], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise GpuwardenError(f"the agent exited at start (status {code}): {' / '.join(tail)[:300]}",
                                 f"see {log}")
        reply = get(socket_path(settings.state_dir), "/healthz", timeout=1.0)
        if reply is not None:
            typer.echo(f"agent running (pid {proc.pid}), API on {socket_path(settings.state_dir)}, log {log}")
            return 0
        time.sleep(0.1)
    raise GpuwardenError(f"the agent (pid {proc.pid}) did not answer within 15s", f"see {log}")


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("agent")
def agent_cmd(
    ctx: typer.Context,
    action: Optional[str] = typer.Argument(
        None, metavar="[start|stop|status|restart]", show_default=False,
        help="start: detach the agent (also without a terminal) and wait until it answers; stop: SIGTERM the "
             "agent of this state dir and wait until it has exited; status: is one running (exit 0), running "
             "but not answering (1), or not (3); restart: stop, then start it again with the command line and "
             "GPUWARDEN_* environment it ran with. Without one: run the agent (detached from a terminal)."),
    interval: Optional[float] = typer.Option(None, "--interval", metavar="SECONDS", min=MIN_REFRESH_S,
                                             help="Seconds between snapshots (default: [agent] interval, 1)."),
    listen_unix: Optional[Path] = typer.Option(None, "--listen-unix", metavar="PATH",
                                               help="Socket of the API (default <state dir>/agent.sock, where "
                                                    "status and the TUI look for it)."),
    foreground: bool = typer.Option(False, "--foreground",
                                    help="Stay in the foreground, logging to stderr (what systemd runs). "
                                         "Without it, from a terminal, the agent detaches."),
    install_systemd: bool = typer.Option(False, "--install-systemd",
                                         help="Write the systemd unit instead of running (a dry run unless "
                                              "--yes)."),
    unit_dir: Path = typer.Option(Path("/etc/systemd/system"), "--unit-dir",
                                  help="Where --install-systemd writes gpuwarden-agent.service."),
    metrics_listen: Optional[str] = typer.Option(
        None, "--metrics-listen", metavar="HOST:PORT", envvar="GPUWARDEN_METRICS_LISTEN",
        help="Serve Prometheus /metrics over HTTP here: 127.0.0.1:9835 for this node only, 0.0.0.0:9835 for "
             "Prometheus elsewhere (a DaemonSet). Off by default; `gpuwarden metrics` works either way."),
    metrics_tls_cert: Optional[Path] = typer.Option(None, "--metrics-tls-cert", metavar="PEM",
                                                    help="Serve /metrics over HTTPS with this certificate chain."),
    metrics_tls_key: Optional[Path] = typer.Option(None, "--metrics-tls-key", metavar="PEM",
                                                   help="The unencrypted key of --metrics-tls-cert."),
    metrics_client_ca: Optional[Path] = typer.Option(
        None, "--metrics-client-ca", metavar="PEM",
        help="Require scrapers to present a client certificate signed by this CA (mutual TLS)."),
    per_process: bool = typer.Option(False, "--per-process",
                                     help="Export VRAM per process and GPU (the largest 256 pairs; off by "
                                          "default to keep the series bounded)."),
    hostname_label: bool = typer.Option(False, "--hostname-label",
                                        help="Add a hostname label to every metric (Prometheus adds instance)."),
    kubernetes: bool = typer.Option(
        False, "--kubernetes",
        help="Kubernetes mode: name the pod of every GPU process and holder, keep the node condition "
             "GPUResidualVRAM and the taint gpuwarden.io/gpu-unhealthy current, post node Events, and (opt-in) "
             "serve AMD's device-plugin health; the node config's [kubernetes] table sets it up. In-cluster "
             "credentials, else KUBECONFIG. With [kubernetes] remediate = true (off by default) a GPU still in "
             "trouble after remediate_after is remediated: a cluster slot (Leases, remediation_slots), cordon, "
             "evictions (PodDisruptionBudgets respected), fix (purge, reset, verify), then uncordon and untaint "
             "only once verified clean; at most once per remediation_interval per node."),
    node_name: Optional[str] = typer.Option(None, "--node-name", metavar="NAME",
                                            help="Kubernetes: this node's name (default: [kubernetes] node_name, "
                                                 "NODE_NAME, the host name)."),
    k8s_policy: Optional[str] = typer.Option(None, "--k8s-policy", metavar="POLICY",
                                             help="Kubernetes: taint (condition and taint, the default), "
                                                  "condition (the condition only) or off."),
    taint_after: Optional[str] = typer.Option(None, "--taint-after", metavar="DURATION",
                                              help="Kubernetes: how long residual VRAM must last before the "
                                                   "taint, e.g. 2m (default: [kubernetes] taint_after, 2m)."),
    amd_health: Optional[bool] = typer.Option(None, "--amd-health/--no-amd-health",
                                              help="Kubernetes: serve AMD's per-GPU health service for its "
                                                   "device plugin (default: [kubernetes] health, off)."),
    amd_health_socket: Optional[str] = typer.Option(None, "--amd-health-socket", metavar="PATH",
                                                    help="Kubernetes: that service's unix socket."),
    yes: Yes = False,
    json_out: JsonOut = False,
) -> None:
    """Run the node agent: one sampler for the node (every second by default), per-GPU history, an event
    log, a kernel-log watch and the policies of the node config's [agent] table; serves
    /healthz, /v1/snapshot, /v1/history, /v1/events and /metrics over a unix socket, and /metrics
    over HTTP(S) with --metrics-listen.

    SIGTERM stops it (exit 0), SIGHUP reloads the node config. Exit 2 when no real GPU backend works
    (pass --backend sim for the simulated node) or another agent runs. `agent start|stop|status|restart`
    manage it without systemd; it holds <state dir>/agent/lock, which names its PID, for its whole life.
    """
    settings: Settings = ctx.obj
    alias = ctx.info_name == "k8s-agent"  # the DaemonSet's command: Kubernetes mode, never detached
    if action is not None:
        if alias or action not in ACTIONS:
            raise GpuwardenError(f"unknown agent action {action!r}" if not alias else
                                 f"k8s-agent takes no action word ({action!r}): it runs in the foreground",
                                 "choose one of: " + ", ".join(ACTIONS) if not alias else
                                 "`gpuwarden agent status|stop` work on the node's agent")
        if install_systemd:
            raise GpuwardenError(f"--install-systemd writes the unit; `agent {action}` works on a running agent",
                                 "run them one at a time")
        if action in ("stop", "status"):
            raise typer.Exit(_lifecycle(ctx, settings, action))
        if action == "restart" and _restart_reuses(ctx, settings):
            raise typer.Exit(0)
        if action == "start":
            _not_running(settings)
        foreground = False  # start (and restart with its own options): always detached, terminal or not
    kubernetes, foreground = kubernetes or alias, foreground or alias
    if kubernetes:  # before the node config is read: a missing client is the first thing to say
        extras.need("kubernetes", "k8s-agent" if alias else "agent --kubernetes")
    k8s_options = dict(node_name=node_name, policy=k8s_policy, taint_after=taint_after, health=amd_health,
                       health_socket=amd_health_socket)
    k8s_cfg = _kubernetes_config(settings, kubernetes, **k8s_options)
    if install_systemd:
        # deferred: keeps `gpuwarden agent --help` cheap (15.4 ms there); only this path of the command needs it
        from gpuwarden.playbooks.agentinstall import InstallUnitPlaybook, unit_text
        # deferred: keeps `gpuwarden agent --help` cheap (15.2 ms there)
        from gpuwarden.playbooks.cli.output import execute, exit_with
        unit = InstallUnitPlaybook(unit_dir)
        result = execute(unit, settings, dry_run=not yes, yes=yes, json_out=json_out)
        if not yes and not json_out and result.exit_code == 0:  # the dry run shows what it would write
            typer.echo(f"\n{unit.path} would be:\n\n{unit_text(unit.program)}", nl=False)
        exit_with(result)
    cfg = _config(settings, interval)
    tls = _tls(metrics_listen, metrics_tls_cert, metrics_tls_key, metrics_client_ca)
    if metrics_listen is not None:  # an empty value (a blank env var) is a mistake, not "no listener"
        # deferred: keeps `gpuwarden agent --help` cheap (19.8 ms there); only this path of the command needs it
        from gpuwarden.ops.services.metrics_server import parse_listen
        parse_listen(metrics_listen)  # a typo fails here, before anything starts or detaches
    sampler = _sampler(settings)
    if action is not None or (not foreground and sys.stdin.isatty() and not os.environ.get("NOTIFY_SOCKET")):
        sampler.close()
        raise typer.Exit(_detach(settings, _without_action(sys.argv[1:], action)))
    # deferred: keeps `gpuwarden agent --help` cheap (71.0 ms there); only this path of the command needs it
    from gpuwarden.ops.services.agent_daemon import Agent
    # deferred: keeps `gpuwarden agent --help` cheap (111.9 ms there)
    from gpuwarden.playbooks.agentpolicies import Policies
    agent = Agent(settings, cfg, socket=listen_unix, sampler=sampler)
    agent.add_observer(Policies(agent, cfg))  # before start: the first snapshot's events count too
    k8s = _kubernetes_node(settings, k8s_cfg, agent, lambda: _kubernetes_config(settings, True, **k8s_options)) \
        if k8s_cfg is not None else None
    exporter = _exporter(agent, metrics_listen, tls, per_process, hostname_label)
    url = exporter.start()  # binds before sampling starts: a busy port fails the start in one line
    try:
        agent.start()
    except BaseException:
        exporter.close()
        if k8s is not None:
            k8s.close()
        raise
    if k8s is not None:
        try:
            k8s.start()  # a busy AMD health socket fails here, in one line
        except BaseException:
            agent.stop()
            raise
    if url:
        agent.log("info", f"metrics on {url}")
    raise typer.Exit(agent.run())

cli.command("k8s-agent", help="The node agent in Kubernetes mode, in the foreground: `gpuwarden agent "
            "--kubernetes --foreground` with the same options (what deploy/k8s's DaemonSet runs).")(agent_cmd)


ACTIONS = ("start", "stop", "status", "restart")


def _without_action(argv: list[str], action: str | None) -> list[str]:
    """This command line without its action word (the detached agent runs, it does not start another)."""
    if action is None or "agent" not in argv:
        return argv
    after = argv.index("agent") + 1
    if action in argv[after:]:
        i = argv.index(action, after)
        return argv[:i] + argv[i + 1:]
    return argv


def _cli_words(argv: tuple[str, ...]) -> list[str] | None:
    """A running agent's command line as gpuwarden's own words (global options, `agent`, its options), without
    the interpreter and program: `python -m gpuwarden.tui.main ...` or `python .../bin/gpuwarden ...`."""
    if "gpuwarden.tui.main" in argv:
        words = list(argv[argv.index("gpuwarden.tui.main") + 1:])
    elif len(argv) > 1 and Path(argv[1]).name == "gpuwarden":
        words = list(argv[2:])
    elif argv and Path(argv[0]).name == "gpuwarden":
        words = list(argv[1:])
    else:
        return None
    return words if "agent" in words else None


def _lifecycle(ctx: typer.Context, settings: Settings, action: str) -> int:
    """`agent stop` and `agent status`: the agent of this state dir, found by the lock it holds."""
    # deferred: keeps `gpuwarden agent --help` cheap (6.2 ms there); only this path of the command needs it
    from gpuwarden.ops.agent import running
    # deferred: keeps `gpuwarden agent --help` cheap (2.3 ms there)
    from gpuwarden.ops.agent.client import get
    # deferred: keeps `gpuwarden agent --help` cheap (69.3 ms there)
    from gpuwarden.ops.services.agent_daemon import socket_path
    _only_action(ctx, action)
    state = settings.state_dir
    run = running.find(state)
    if action == "stop":
        if run is None:
            typer.echo(f"agent: not running for {state}")
            return 0
        running.refuse_managed(run, "stop")
        took = running.stop(state, run)
        typer.echo(f"agent: stopped (pid {run.pid}, {took:.1f}s after SIGTERM)")
        return 0
    if run is None:
        typer.echo(f"agent: not running for {state}")
        return 3
    reply = get(socket_path(state), "/healthz", timeout=2.0)
    where = f" under systemd as {run.unit}" if run.unit else ""
    if reply is None:
        typer.echo(f"agent: running (pid {run.pid}){where} but its API on {socket_path(state)} does not answer")
        return 1
    health = reply.json()
    age = health.get("age_s")
    typer.echo(f"agent: running (pid {run.pid}){where}, up {health.get('uptime_s', 0):.0f}s, backend "
               f"{health.get('backend') or '?'}, last snapshot {'-' if age is None else f'{age:.1f}s'} ago, "
               f"API on {socket_path(state)}" + ("" if health.get("ok") else "; NOT OK: "
                                                + str(health.get("sampling_error") or "its data is stale")))
    return 0 if health.get("ok") else 1


def _not_running(settings: Settings) -> None:
    """`agent start` when one runs already: say so and which, exit 0 (it is running, as asked)."""
    # deferred: keeps `gpuwarden agent --help` cheap (6.2 ms there); only this path of the command needs it
    from gpuwarden.ops.agent import running
    run = running.find(settings.state_dir)
    if run is not None:
        typer.echo(f"agent: already running for {settings.state_dir} (pid {run.pid}); `gpuwarden agent restart` "
                   "starts it again", err=True)
        raise typer.Exit(0)


def _only_action(ctx: typer.Context, action: str) -> None:
    """stop, status and restart act on the running agent: an option meant for a new one is a mistake."""
    given = [p.opts[0] for p in ctx.command.params
             if p.name != "action" and p.opts and ctx.get_parameter_source(p.name) not in
             (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)]
    if given:
        raise GpuwardenError(f"`agent {action}` takes no options ({', '.join(given)}): it works on the running agent",
                             f"`gpuwarden agent stop`, then `gpuwarden agent start {given[0]} ...` to change them"
                             if action != "stop" else "leave them out")


def _restart_reuses(ctx: typer.Context, settings: Settings) -> bool:
    """`agent restart`: stop the running agent and start it again as it ran (its argv and GPUWARDEN_*
    environment). False when none runs: the caller starts one with this command line's options."""

    # deferred: keeps `gpuwarden agent --help` cheap (6.2 ms there); only this path of the command needs it
    from gpuwarden.ops.agent import running
    run = running.find(settings.state_dir)
    if run is None:
        typer.echo(f"agent: not running for {settings.state_dir}; starting it", err=True)
        return False
    _only_action(ctx, "restart")
    running.refuse_managed(run, "restart")
    argv = _cli_words(run.argv)
    if argv is None:
        raise GpuwardenError(f"the agent (pid {run.pid}) runs as {' '.join(run.argv)[:200]!r}: not a command line "
                             "`agent restart` can run again", "stop it, then start it with the options it needs")
    took = running.stop(settings.state_dir, run)
    typer.echo(f"agent: stopped (pid {run.pid}, {took:.1f}s after SIGTERM)", err=True)
    argv = [w for w in argv if w not in ("--foreground", *ACTIONS)]
    argv.insert(argv.index("agent") + 1, "start")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")} | run.env
    # The same program, its options and environment: a detaching start waits until the new agent answers.
    code = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", *argv], env=env,
                          stdin=subprocess.DEVNULL).returncode
    if code:
        raise typer.Exit(code)
    return True


_K8S_FLAGS = {"node_name": "--node-name", "policy": "--k8s-policy", "taint_after": "--taint-after",
              "health": "--amd-health", "health_socket": "--amd-health-socket"}


def _kubernetes_config(settings: Settings, on: bool, **overrides):
    """The [kubernetes] table with the command line's overrides, checked before anything starts; None when off."""
    given = [_K8S_FLAGS[k] for k, v in overrides.items() if v is not None]
    if not on:
        if given:
            raise GpuwardenError(f"{given[0]} is an option of Kubernetes mode",
                                 "add --kubernetes (or run `gpuwarden k8s-agent`)")
        return None
    # deferred: keeps `gpuwarden agent --help` cheap (13.8 ms there)
    from gpuwarden.ops.k8s.nodesignal import POLICIES
    policy, taint_after = overrides.get("policy"), overrides.get("taint_after")
    if policy is not None and policy not in POLICIES:
        raise GpuwardenError(f"unknown --k8s-policy {policy!r}", f"choose one of: {', '.join(POLICIES)}")
    if taint_after is not None:
        overrides["taint_after"] = parse_duration(taint_after)
    return for_settings(settings, **overrides)


def _kubernetes_node(settings: Settings, k8s_cfg, agent, reread):
    """Kubernetes mode attached to the agent: its lines are the agent's events (kind "kubernetes")."""
    # deferred: keeps `gpuwarden agent --help` cheap (56.1 ms there); only this path of the command needs it
    from gpuwarden.ops.services.k8s_node import KubernetesNode
    # deferred: keeps `gpuwarden agent --help` cheap (11.2 ms there)
    from gpuwarden.ops.sampling.changes import NodeEvent

    def log(level: str, text: str) -> None:
        agent.emit(NodeEvent(time.time(), level, text, "kubernetes"))
    fixer = None
    if k8s_cfg.remediate:
        # deferred: keeps `gpuwarden agent --help` cheap (69.4 ms there)
        from gpuwarden.playbooks.k8s_remediate import fixer as fix_playbook
        fixer = fix_playbook(settings)
    post_cleaner = None
    if k8s_cfg.post_clean:
        # deferred: keeps `gpuwarden agent --help` cheap (62.5 ms there)
        from gpuwarden.playbooks.k8s_postclean import cleaner as clean_playbook
        post_cleaner = clean_playbook(settings)
    # credentials are checked here
    node = KubernetesNode(settings, k8s_cfg, log=log, reread=reread, fixer=fixer, post_cleaner=post_cleaner)
    node.attach(agent)
    return node


def _tls(listen: str | None, cert: Path | None, key: Path | None, client_ca: Path | None):
    if not (cert or key or client_ca):
        return None
    if not listen:
        raise GpuwardenError("--metrics-tls-cert/--metrics-tls-key/--metrics-client-ca need --metrics-listen",
                             "e.g. --metrics-listen 0.0.0.0:9835 --metrics-tls-cert c.pem --metrics-tls-key k.pem")
    if cert is None or key is None:
        raise GpuwardenError("HTTPS for /metrics needs both --metrics-tls-cert and --metrics-tls-key",
                             "give the PEM certificate chain and its key")
    # deferred: keeps `gpuwarden agent --help` cheap (20.2 ms there); only this path of the command needs it
    from gpuwarden.ops.services.metrics_server import TlsFiles
    files = TlsFiles(cert, key, client_ca)
    files.context()  # an unreadable certificate fails here, with its name
    return files


def _exporter(agent, listen: str | None, tls, per_process: bool, hostname_label: bool):
    """The exporter is always attached: `gpuwarden metrics` asks it over the API socket."""
    # deferred: keeps `gpuwarden agent --help` cheap (92.9 ms there); only this path of the command needs it
    from gpuwarden.ops.services.metrics_exporter import MetricsExporter
    # deferred: keeps `gpuwarden agent --help` cheap (5.0 ms there)
    from gpuwarden.ops.metrics.reading import MetricsOptions
    options = MetricsOptions(per_process=per_process, hostname=os.uname().nodename if hostname_label else None)
    exporter = MetricsExporter(agent, options, listen, tls)
    agent.metrics = exporter
    agent.add_observer(exporter)
    return exporter
