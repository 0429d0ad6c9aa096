"""`gpuwarden serve`: the console (or the fleet console) in a browser through textual-serve.

Loopback by default; any other address needs a token (generated when not given). Read-only unless
--allow-actions. Each browser session runs its own console process, as over SSH.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from gpuwarden.ops.errors import GpuwardenError

COOKIE = "gpuwarden_token"
TOKEN_ENV = "GPUWARDEN_SERVE_TOKEN"


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise GpuwardenError(f"--listen {text!r} is not HOST:PORT", "e.g. --listen 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def served_command(settings_args: list[str], *, fleet_args: list[str] | None, allow_actions: bool) -> str:
    """The command each browser session runs: this program's console, read-only unless actions are allowed."""
    argv = [sys.executable, "-m", "gpuwarden.tui.main", *settings_args]
    argv += ["fleet", "tui", *fleet_args] if fleet_args is not None else ["tui"]
    if not allow_actions:
        argv.append("--read-only")
    return shlex.join(argv)


def make_server(command: str, host: str, port: int, token: str | None, public_url: str | None, title: str):
    """A textual-serve Server that asks for the token (query `token=` once, then a cookie) when there is one."""
    from aiohttp import web
    from textual_serve.server import Server

    @web.middleware
    async def require_token(request, handler):
        if token is not None and not request.path.startswith("/static/"):
            given = request.query.get("token") or request.cookies.get(COOKIE) or ""
            if not hmac.compare_digest(given.encode(), token.encode()):
                return web.Response(status=403, text="gpuwarden serve: a token is required: open the URL that "
                                                     "`gpuwarden serve` printed (…/?token=…)\n")
        response = await handler(request)
        if token is not None and request.query.get("token") and isinstance(response, web.Response):
            # The page's websocket cannot carry the query string: the same origin sends this cookie instead.
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        return response

    class GuardedServer(Server):
        async def _make_app(self):
            app = await super()._make_app()
            app.middlewares.append(require_token)
            return app

    shown = public_url or f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    return GuardedServer(command, host=host, port=port, title=title, public_url=shown)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        ctx: typer.Context,
        listen: str = typer.Option("127.0.0.1:8080", "--listen", metavar="HOST:PORT",
                                   help="Address to serve on; anything but loopback requires a token."),
        token: Optional[str] = typer.Option(None, "--token", envvar=TOKEN_ENV, show_default=False,
                                            help="Token the browser must present (default: none on loopback, a "
                                                 "new random one elsewhere, printed in the URL)."),
        allow_actions: bool = typer.Option(False, "--allow-actions",
                                           help="Let the browser run playbooks (default: read-only consoles)."),
        public_url: Optional[str] = typer.Option(None, "--public-url", metavar="URL",
                                                 help="The URL browsers use to reach this server (behind a proxy, "
                                                      "or when listening on 0.0.0.0)."),
        fleet: bool = typer.Option(False, "--fleet", help="Serve the fleet console instead of this node's."),
        nodelist: Optional[str] = typer.Option(None, "--nodelist", help="With --fleet: Slurm hostlist of nodes."),
        hosts: Optional[Path] = typer.Option(None, "--hosts", metavar="FILE", help="With --fleet: hosts file."),
        fleet_config: Optional[Path] = typer.Option(None, "--fleet-config", metavar="FILE",
                                                    help="With --fleet: fleet config TOML."),
        ssh_config: Optional[Path] = typer.Option(None, "--ssh-config", "-F", metavar="FILE",
                                                  help="With --fleet: OpenSSH client config."),
        prometheus: Optional[str] = typer.Option(None, "--prometheus", metavar="URL",
                                                 help="With --fleet: read the fleet from this Prometheus first "
                                                      "(see `fleet tui --help`)."),
    ) -> None:
        """Serve the console in a browser (textual-serve): this node's, or with --fleet the fleet console.

        Listens on loopback unless told otherwise; on any other address a token is required (a random one is
        made and printed when --token is not given). Consoles are read-only unless --allow-actions.
        """
        host, port = parse_listen(listen)
        if token is None and not is_loopback(host):
            token = secrets.token_urlsafe(24)
        if token is not None and len(token) < 16:
            raise GpuwardenError("--token is too short", "use 16 characters or more (or leave it out for a random one)")
        settings = ctx.obj
        settings_args = ["--state-dir", str(settings.state_dir), "--config", str(settings.config_path)]
        if settings.backend:
            settings_args += ["--backend", settings.backend]
        fleet_args = None
        if fleet:
            fleet_args = []
            for flag, value in (("--nodelist", nodelist), ("--hosts", hosts), ("--fleet-config", fleet_config),
                                ("--ssh-config", ssh_config)):
                if value is not None:
                    fleet_args += [flag, str(Path(value).resolve()) if isinstance(value, Path) else value]
            if prometheus is not None:
                # Through the environment: a URL with credentials in it stays out of every process's argv.
                os.environ["GPUWARDEN_PROMETHEUS"] = prometheus
        elif any(v is not None for v in (nodelist, hosts, fleet_config, ssh_config, prometheus)):
            raise GpuwardenError("--nodelist/--hosts/--fleet-config/--ssh-config/--prometheus go with --fleet",
                                 "add --fleet to serve the fleet console")
        command = served_command(settings_args, fleet_args=fleet_args, allow_actions=allow_actions)
        server = make_server(command, host, port, token, public_url,
                             "gpuwarden fleet" if fleet else "gpuwarden")
        url = server.public_url + (f"/?token={token}" if token else "/")
        mode = "actions allowed" if allow_actions else "read-only"
        typer.echo(f"gpuwarden serve: {'fleet console' if fleet else 'console'} ({mode}) at {url}", err=True)
        os.environ.pop("TEXTUAL_DRIVER", None)  # the served consoles get the web driver from textual-serve
        try:
            server.serve()
        except OSError as exc:
            raise GpuwardenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                                 "choose another --listen port, or stop what uses this one") from None
