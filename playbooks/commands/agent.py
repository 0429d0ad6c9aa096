"""CLI: `gpuwarden agent` — the node agent: sample continuously, keep history and events, serve the local API.

Runs in the foreground under systemd (Type=notify) or with --foreground; from a terminal it detaches and says
where it listens. --install-systemd writes its unit (a dry run unless --yes).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ops.errors import GpuwardenError
from ops.settings import Settings

from .playbook_options import JsonOut, Yes


def _config(settings: Settings, interval: float | None):
    from dataclasses import replace

    from ops import nodeconfig
    from ops.agent.config import AgentConfig
    cfg = nodeconfig.load(settings).agent if settings.config_path.exists() else AgentConfig()
    if interval is not None:
        cfg = replace(cfg, interval=interval)
    return cfg


def _sampler(settings: Settings):
    """The agent's sampler. An agent on the automatic sim fallback would serve a fake node as if it were this
    one: without a real backend (or --backend sim) it refuses, exit 2."""
    from ops.backends.select import open_backend
    from ops.sampling.sampler import Sampler
    return Sampler(settings, open_backend(settings, fallback_to_sim=False))


def _detach(settings: Settings, argv: list[str]) -> int:
    """Start the agent as a daemon (its log in the state dir) and wait until it answers or fails."""
    import subprocess

    from ops.agent.client import get
    from ops.agent.daemon import agent_dir, socket_path
    from ops.statedir import ensure
    ensure(settings.state_dir, "agent")
    log = agent_dir(settings.state_dir) / "agent.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tui.main", *argv, "--foreground"], stdin=subprocess.DEVNULL,
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


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent_cmd(
        ctx: typer.Context,
        interval: Optional[float] = typer.Option(None, "--interval", metavar="SECONDS", min=0.25,
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
        yes: Yes = False,
        json_out: JsonOut = False,
    ) -> None:
        """Run the node agent: one sampler for the node (every second by default), per-GPU history, an event
        log, a kernel-log watch and the policies of the node config's [agent] table; serves
        /healthz, /v1/snapshot, /v1/history and /v1/events over a unix socket.

        SIGTERM stops it (exit 0), SIGHUP reloads the node config. Exit 2 when no real GPU backend works
        (pass --backend sim for the simulated node) or another agent runs.
        """
        settings: Settings = ctx.obj
        if install_systemd:
            from playbooks.agentinstall import InstallUnitPlaybook
            from playbooks.output import execute, exit_with
            exit_with(execute(InstallUnitPlaybook(unit_dir), settings, dry_run=not yes, yes=yes, json_out=json_out))
        cfg = _config(settings, interval)
        sampler = _sampler(settings)
        if not foreground and sys.stdin.isatty() and not os.environ.get("NOTIFY_SOCKET"):
            sampler.close()
            raise typer.Exit(_detach(settings, sys.argv[1:]))
        from ops.agent.daemon import Agent
        from playbooks.agentpolicies import Policies
        agent = Agent(settings, cfg, socket=listen_unix, sampler=sampler)
        agent.add_observer(Policies(agent, cfg))  # before start: the first snapshot's events count too
        agent.start()
        raise typer.Exit(agent.run())
