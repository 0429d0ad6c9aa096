"""Live fleet: one persistent SSH connection per node carrying that node's snapshot stream, in one thread.

Each node runs `gpuwarden status --watch --json` once; every line is a snapshot. Nothing is started per
refresh, so watching many nodes costs the console little. Remote commands reuse the same connections.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Coroutine, TypeVar

from gpuwarden.ops.fleet.fanout import HostResult
from gpuwarden.ops.fleet.inventory import Host
from gpuwarden.ops.fleet.ssh import SshSettings, Unreachable, connect
from gpuwarden.ops.fleet.summary import NodeRow, from_snapshot

if TYPE_CHECKING:
    import asyncssh

T = TypeVar("T")
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # back-off between reconnections of a node that went away


@dataclass
class NodeFeed:
    """What the monitor knows of one node: the last snapshot (and its number), or why there is none."""

    host: Host
    snapshot: dict[str, Any] | None = None
    seq: int = 0
    received: float | None = None  # monotonic
    error: str | None = None
    hint: str | None = None
    connected: bool = False
    conn: asyncssh.SSHClientConnection | None = None


class FleetMonitor:
    """Owns the event loop thread, the connections and the latest snapshot of every node."""

    def __init__(self, hosts: list[Host], ssh: SshSettings, command: Callable[..., str], *, interval: float = 1.0,
                 parallel: int = 32, follow: tuple[str, ...] | None = None):
        self.hosts = list(hosts)
        self.ssh = ssh
        self.command = command  # command(*args) -> the remote shell line running `gpuwarden ARGS`
        self.interval = interval
        self.feeds = {h.name: NodeFeed(h) for h in self.hosts}
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="gpuwarden-fleet", daemon=True)
        # Connection set-up only; streams then run side by side. Bound to the monitor's loop on first use.
        self._sem = asyncio.Semaphore(parallel)
        # The nodes streamed over SSH: every node by default; a subclass that reads elsewhere picks them.
        self._initial = tuple(self.feeds) if follow is None else tuple(follow)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> "FleetMonitor":
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        for name in self._initial:
            self._start_stream(name)
        try:
            self._loop.run_forever()
        finally:
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def _start_stream(self, name: str) -> None:
        if name not in self._tasks and name in self.feeds:
            self._tasks[name] = self._loop.create_task(self._follow(self.feeds[name], self._sem))

    def _stop_stream(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    def follow(self, name: str) -> None:
        """Stream node `name` over SSH (any thread); nothing when it already is."""
        if not self._closed:
            self._loop.call_soon_threadsafe(self._start_stream, name)

    def unfollow(self, name: str) -> None:
        """Close node `name`'s SSH stream (any thread); its last snapshot stays."""
        if not self._closed:
            self._loop.call_soon_threadsafe(self._stop_stream, name)

    def pin(self, name: str | None) -> None:
        """The node open in the console (None: back to the fleet). Every node is streamed here already."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        with self._changed:
            self._changed.notify_all()

    # --- the streams --------------------------------------------------------------------------
    async def _follow(self, feed: NodeFeed, sem: asyncio.Semaphore) -> None:
        failures = 0
        while True:
            try:
                async with sem:
                    conn = await asyncio.wait_for(connect(feed.host, self.ssh), self.ssh.connect_timeout + 1)
                feed.conn, feed.connected = conn, True
                await self._stream(feed, conn)
                self._note(feed, error="the snapshot stream ended", hint="the node's gpuwarden exited; reconnecting")
            except Unreachable as exc:
                self._note(feed, error=exc.message, hint=exc.hint)
            except (asyncio.TimeoutError, TimeoutError):
                self._note(feed, error=f"no SSH answer within {self.ssh.connect_timeout:g}s")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a dropped connection mid-stream: say so and try again later
                self._note(feed, error=f"connection lost: {exc}")
            finally:
                if feed.conn is not None:
                    feed.conn.close()
                feed.conn, feed.connected = None, False
            failures += 1
            await asyncio.sleep(RETRY_S[min(failures - 1, len(RETRY_S) - 1)])

    async def _stream(self, feed: NodeFeed, conn: asyncssh.SSHClientConnection) -> None:
        command = self.command("status", "--watch", "--json", "--interval", f"{self.interval:g}")
        # deferred: optional extra [fleet]; asyncssh (and cryptography) load only when a node is reached over ssh
        import asyncssh
        proc = await conn.create_process(command, stderr=asyncssh.DEVNULL)
        try:
            async for line in proc.stdout:
                try:
                    snap = json.loads(line)
                except ValueError:
                    continue
                if isinstance(snap, dict) and "gpus" in snap:
                    with self._changed:
                        feed.snapshot, feed.seq, feed.received = snap, feed.seq + 1, time.monotonic()
                        feed.error = feed.hint = None
                        self._changed.notify_all()
        finally:
            proc.close()
        status = proc.exit_status
        if status == 127:
            raise Unreachable("gpuwarden not found on the node", "set fleet.command / --remote-command")

    def _note(self, feed: NodeFeed, error: str, hint: str | None = None) -> None:
        with self._changed:
            feed.error, feed.hint = error, hint
            self._changed.notify_all()

    # --- readers (any thread) -----------------------------------------------------------------
    def rows(self, stale_after: float | None = None) -> list[NodeRow]:
        """A row per node from its last snapshot; a node with none (or none for `stale_after` s) says why."""
        out = []
        now = time.monotonic()
        with self._changed:
            for feed in self.feeds.values():
                out.append(self._row(feed, now, stale_after))
        return out

    def _row(self, feed: NodeFeed, now: float, stale_after: float | None) -> NodeRow:
        host = feed.host
        if feed.snapshot is None or (feed.error and not feed.connected):
            reason = feed.error or "connecting..."
            return NodeRow(host.name, host.target, "unreachable", reason=reason, hint=feed.hint)
        age = now - (feed.received or now)
        row = from_snapshot(HostResult(host, None), feed.snapshot)
        if stale_after is not None and age > stale_after:
            return NodeRow(host.name, host.target, "unreachable", reason=f"no snapshot for {age:.0f}s",
                           hint="the node or its gpuwarden may hang")
        return row

    def latest(self, name: str) -> tuple[int, dict[str, Any] | None, str | None]:
        feed = self.feeds[name]
        with self._changed:
            return feed.seq, feed.snapshot, feed.error

    def wait_newer(self, name: str, seq: int, timeout: float) -> tuple[int, dict[str, Any] | None, str | None]:
        """Block (not on an event loop) until node `name` has a snapshot newer than `seq`, or timeout."""
        feed = self.feeds[name]
        deadline = time.monotonic() + timeout
        with self._changed:
            while feed.seq <= seq and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return feed.seq, feed.snapshot, feed.error

    # --- remote commands on the same connections ----------------------------------------------
    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run_remote(self, name: str, command: str, on_line: Callable[[str], None]) -> Future[tuple[int, str]]:
        """Run `command` on node `name` over its open connection; on_line(line) for each stdout line (in the
        monitor's thread). The future's result is (exit status, stderr)."""
        feed = self.feeds[name]

        async def go() -> tuple[int, str]:
            conn = feed.conn
            if conn is None:
                raise Unreachable(f"{name} is not connected: {feed.error or 'connecting'}",
                                  "wait until the node answers again")
            proc = await conn.create_process(command)
            err = asyncio.ensure_future(proc.stderr.read())
            async for line in proc.stdout:
                on_line(line)
            await proc.wait_closed()
            return (proc.exit_status if proc.exit_status is not None else 255), await err
        return self.submit(go())
