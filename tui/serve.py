"""`gpuwarden serve`: the console (or the fleet console) in a browser through textual-serve.

Loopback by default; any other address needs a token (generated when not given). Read-only unless
--allow-actions. Each browser session runs its own console process, as over SSH, and ends with its session.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import shlex
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from gpuwarden.ops.foundation import extras
from gpuwarden.ops.foundation.errors import GpuwardenError

COOKIE = "gpuwarden_token"
TOKEN_ENV = "GPUWARDEN_SERVE_TOKEN"
DRIVER = "gpuwarden.tui.web_driver:ServedWebDriver"  # Textual's web driver, ending the console at end of input
QUIT_GRACE_S = 3.0  # a session's console gets this long to quit when asked (it stops its sampler), then SIGTERM,
TERM_GRACE_S = 1.0  # then this long before SIGKILL
SHUTDOWN_S = 8.0  # serve's own exit: at most this long for the sessions to end (each is killed within 4 s)

# A page the browser leaves for another is often kept whole in its back/forward cache, websocket open, so the
# session and its console would live on unseen: the page closes its websockets when hidden, and starts a new
# session if it is ever shown again from that cache.
PAGE_HOOK = """<script>
(() => {
  const sockets = [];
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) { super(...args); sockets.push(this); }
  };
  addEventListener("pagehide", () => { for (const socket of sockets) socket.close(1001, "page hidden"); });
  addEventListener("pageshow", (event) => { if (event.persisted) location.reload(); });
})();
</script>
"""


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
    """A textual-serve Server that asks for the token (query `token=` once, then a cookie) when there is one, and
    ends each session's console with its websocket, and every one of them with serve."""
    # deferred: keeps `gpuwarden serve --help` cheap (18.1 ms there)
    import asyncio
    # deferred: keeps `gpuwarden serve --help` cheap (2.1 ms there)
    import logging

    # deferred: the web server (aiohttp, textual-serve) loads only for `gpuwarden serve`
    extras.need("serve", "serve")
    # deferred: optional extra [serve]
    from aiohttp import web
    # deferred: optional extra [serve]
    from textual_serve.app_service import AppService
    # deferred: optional extra [serve]
    from textual_serve.server import Server, to_int

    log = logging.getLogger("textual-serve")

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

    class SessionConsole(AppService):
        """One browser session's console, run without a shell (the process serve holds is the console itself),
        leading its own process group, and ended by end(): asked to quit, its input closed, then SIGTERM, then
        SIGKILL to the group, and reaped. textual-serve's own stop() only asks, and never waits for the process."""

        _ending: "asyncio.Task[None] | None" = None

        def _build_environment(self, width: int = 80, height: int = 24) -> dict[str, str]:
            env = super()._build_environment(width=width, height=height)
            env["TEXTUAL_DRIVER"] = DRIVER
            env["GPUWARDEN_SERVE_PID"] = str(os.getpid())  # the console asks for a death signal tied to us
            return env

        async def _open_app_process(self, width: int = 80, height: int = 24):
            # From the event loop's thread (serve's main thread): the console's PR_SET_PDEATHSIG follows it.
            self._process = process = await asyncio.create_subprocess_exec(
                *shlex.split(self.command), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self._build_environment(width=width, height=height),
                start_new_session=True)  # Ctrl-C in serve's terminal reaches serve, which then ends each session
            self._stdin = process.stdin
            return process

        @property
        def alive(self) -> bool:
            return self._process is not None and self._process.returncode is None

        async def stop(self) -> None:
            await self.end()

        def end(self) -> "asyncio.Future[None]":
            """End the console (once, in a task of its own: a cancelled websocket handler does not cut it short)."""
            if self._ending is None:
                self._ending = asyncio.ensure_future(self._end())
            return asyncio.shield(self._ending)

        async def _end(self) -> None:
            process, task = self._process, self._task
            if process is not None and process.returncode is None:
                if task is not None:
                    await self._download_manager.cancel_app_downloads(app_service_id=self.app_service_id)
                    await self._ask(self.send_meta({"type": "quit"}))
                if process.stdin is not None:
                    process.stdin.close()  # end of input: the console's driver ends the app even if it missed quit
                if not await self._exited(process, QUIT_GRACE_S):
                    self._signal(process, signal.SIGTERM)
                    if not await self._exited(process, TERM_GRACE_S):
                        self._signal(process, signal.SIGKILL)
                        await self._exited(process, 5.0)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self._task = None

        @staticmethod
        async def _ask(request) -> None:
            try:
                await asyncio.wait_for(request, 1.0)  # a console that reads no input does not hold us up
            except (asyncio.TimeoutError, OSError, RuntimeError):
                pass

        @staticmethod
        async def _exited(process, within: float) -> bool:
            try:
                await asyncio.wait_for(process.wait(), within)
            except asyncio.TimeoutError:
                return False
            return True

        @staticmethod
        def _signal(process, sig: int) -> None:
            if process.returncode is None:  # not reaped: its pid, and so its group's id, is still its own
                try:
                    os.killpg(process.pid, sig)  # the group: whatever the console started goes too
                except ProcessLookupError:
                    pass

    class GuardedServer(Server):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.sessions: dict[SessionConsole, web.WebSocketResponse] = {}  # open sessions: serve ends them all

        async def _make_app(self):
            app = await super()._make_app()
            app.middlewares.append(require_token)
            app.on_shutdown.append(self._end_sessions)
            return app

        async def handle_index(self, request):
            response = await super().handle_index(request)
            if isinstance(response, web.Response) and response.text:
                response.text = response.text.replace("<head>", "<head>\n" + PAGE_HOOK, 1)
            response.headers["Cache-Control"] = "no-store"  # and no back/forward cache where the browser obeys
            return response

        async def handle_websocket(self, request):
            """One session: its console starts with the websocket and ends when it closes, whatever closed it
            (the page went, the browser went and the heartbeat or the TCP connection says so, serve exits)."""
            websocket = web.WebSocketResponse(heartbeat=15)
            width = to_int(request.query.get("width", "80"), 80)
            height = to_int(request.query.get("height", "24"), 24)
            await websocket.prepare(request)
            console = SessionConsole(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                                     close=websocket.close, download_manager=self.download_manager,
                                     debug=self.debug)
            self.sessions[console] = websocket
            try:
                await console.start(width, height)
                await self._process_messages(websocket, console)
            except Exception as error:  # noqa: BLE001 (a session's failure is logged; serve carries on)
                log.exception(error)
            finally:
                try:
                    await console.end()
                finally:
                    self.sessions.pop(console, None)
                    await websocket.close()
            return websocket

        async def _end_sessions(self, _app) -> None:
            """On serve's way out (SIGTERM, SIGINT): end every console, then close the sockets so that aiohttp's
            wait for open handlers ends at once instead of at its shutdown timeout."""
            sessions = list(self.sessions.items())
            await asyncio.gather(*(console.end() for console, _ in sessions), return_exceptions=True)
            await asyncio.gather(*(ws.close(code=1001, message=b"gpuwarden serve stopped")
                                   for _, ws in sessions), return_exceptions=True)

        def serve(self, debug: bool = False) -> None:
            self.debug = debug
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.add_signal_handler(signal.SIGINT, self.request_exit)
            loop.add_signal_handler(signal.SIGTERM, self.request_exit)
            try:
                web.run_app(self._make_app(), host=self.host, port=self.port, handle_signals=False, loop=loop,
                            shutdown_timeout=SHUTDOWN_S, print=lambda *args: None)
            finally:
                # Whatever ended the loop, no console outlives serve (each also has its PR_SET_PDEATHSIG).
                for console in list(self.sessions):
                    if console.alive:
                        console._signal(console._process, signal.SIGKILL)

    shown = public_url or f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    return GuardedServer(command, host=host, port=port, title=title, public_url=shown)


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("serve")
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
    extras.need("serve", "serve")
    if fleet and prometheus is None:  # with Prometheus, SSH is only the fallback for nodes it lacks
        extras.need("fleet", "serve --fleet")
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
        # The fleet as `fleet tui` will take it, judged now (host count, hosts file, fleet and ssh config):
        # a 'node[1-99999999]' must be refused here, not by the console each browser session starts.
        # deferred: keeps `gpuwarden serve --help` cheap (45.2 ms there)
        from gpuwarden.playbooks.fleet.target import resolve
        resolve(hosts_file=hosts, hosts_from=None, group=None, nodelist=nodelist, fleet_config=fleet_config,
                ssh_config=ssh_config, accept_new=False, parallel=None, timeout=None, remote_command=None,
                reads_prometheus=True, prometheus=prometheus)
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
