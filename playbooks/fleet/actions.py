"""A node's own playbook run on many nodes over SSH: its plan (--dry-run), or the run with its events.

Each node runs `gpuwarden <playbook> --json` itself, so its locks, checks and journal apply; the journal
line says which operator asked and that the request came from the fleet (GPUWARDEN_FLEET_ORIGIN).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuwarden.ops.fleet.fanout import NOT_FOUND, HostResult, fan_out
from gpuwarden.ops.fleet.inventory import Host

from gpuwarden.ops.foundation.journal import FLEET_ORIGIN_ENV as ORIGIN_ENV
from gpuwarden.playbooks.framework import Event
from gpuwarden.ops.foundation import jsondoc
from gpuwarden.playbooks.baseline import BaselinePlaybook
from gpuwarden.playbooks.bundle import BundlePlaybook
from gpuwarden.playbooks.drain import DrainPlaybook, UndrainPlaybook
from gpuwarden.playbooks.launch import LaunchPlaybook
from gpuwarden.playbooks.purge import PurgePlaybook
from gpuwarden.playbooks.reset import ResetPlaybook
from gpuwarden.playbooks.stop import StopEnginePlaybook

from gpuwarden.playbooks.fleet.target import FleetTarget, fleet_origin

ACTION_DEADLINE_S = 900.0  # a drain waits for engines to stop: give a node's playbook far longer than a status


@dataclass(frozen=True)
class RemotePlaybook:
    """What to run on each node: the node CLI's words (without --dry-run/--yes/--json) and whether it is destructive."""

    name: str
    argv: tuple[str, ...]
    destructive: bool
    title: str
    # The node's confirmation is given here, once for the set: the node runs it with --yes.
    run_flags: tuple[str, ...] = ("--yes", "--json")


def purge(gpu: int | None) -> RemotePlaybook:
    return RemotePlaybook("purge", ("purge",) + ((str(gpu),) if gpu is not None else ()), PurgePlaybook.destructive,
                          "purge residual VRAM holders" + (f" on GPU {gpu}" if gpu is not None else " on every GPU"))


def drain(gpu: int, reason: str = "") -> RemotePlaybook:
    return RemotePlaybook("drain", ("drain", str(gpu)) + (("--reason", reason) if reason else ()),
                          DrainPlaybook.destructive, f"drain GPU {gpu}")


def undrain(gpu: int) -> RemotePlaybook:
    return RemotePlaybook("undrain", ("undrain", str(gpu)), UndrainPlaybook.destructive, f"undrain GPU {gpu}")


def reset(gpu: int) -> RemotePlaybook:
    return RemotePlaybook("reset", ("reset", str(gpu)), ResetPlaybook.destructive, f"reset GPU {gpu}")


def baseline(gpu: int | None) -> RemotePlaybook:
    return RemotePlaybook("baseline", ("baseline", "record") + ((str(gpu),) if gpu is not None else ()),
                          BaselinePlaybook.destructive, "record the idle baseline")


def launch() -> RemotePlaybook:
    return RemotePlaybook("launch", ("launch",), LaunchPlaybook.destructive, "launch the configured engines")


def stop_engine(name: str) -> RemotePlaybook:
    return RemotePlaybook("stop", ("engines", "stop", name), StopEnginePlaybook.destructive, f"stop engine {name}",
                          run_flags=("--json",))  # engines stop asks nothing itself


def bundle() -> RemotePlaybook:
    return RemotePlaybook("bundle", ("bundle",), BundlePlaybook.destructive, "collect an incident bundle",
                          run_flags=("--json",))


@dataclass
class NodeRun:
    """One node's answer: its events (the node's own JSON lines), exit status, or why it never ran."""

    host: Host
    events: list[dict[str, Any]] = field(default_factory=list)
    exit_status: int | None = None
    error: str | None = None
    hint: str | None = None
    stderr: str = ""
    duration_s: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.error is not None or self.exit_status is None:
            return 2
        return self.exit_status if self.exit_status in (0, 1, 2, 130) else 2

    @property
    def done_message(self) -> str:
        done = next((e for e in reversed(self.events) if e.get("kind") == "done"), None)
        if done is not None:
            return str(done.get("message", ""))
        if self.error:
            return self.error
        last = self.stderr.strip().splitlines()
        return last[-1] if last else f"exited {self.exit_status}"

    def plan(self) -> list[dict[str, Any]]:
        planned = next((e for e in self.events if e.get("kind") == "planned"), None)
        return list((planned or {}).get("data", {}).get("steps", []))


def event_from_dict(d: dict[str, Any]) -> Event:
    """A node's JSON event line back as the framework's Event (unknown keys ignored)."""
    return Event(str(d.get("kind", "info")), str(d.get("playbook", "")), d.get("step"), str(d.get("message", "")),
                 d.get("data") if isinstance(d.get("data"), dict) else {},
                 d.get("ts") if isinstance(d.get("ts"), (int, float)) else time.time())


def fleet_event(node: str, *, event: dict[str, Any] | None = None, exit_code: int | None = None,
                error: str | None = None, hint: str | None = None) -> dict[str, Any]:
    """One line of `fleet <playbook> --json`: a node's event, its end (exit_code), or why it could not run."""
    ts = time.time()
    kind = "event" if event is not None else ("unreachable" if error else "exit")
    return jsondoc.document("fleet-event", {"ts": ts, "ts_iso": jsondoc.iso(ts), "node": node, "kind": kind,
                                            "event": event, "exit_code": exit_code, "error": error, "hint": hint})


def command_line(target: FleetTarget, rp: RemotePlaybook, *, dry_run: bool) -> str:
    flags = ("--dry-run", "--json") if dry_run else rp.run_flags
    return target.remote(*rp.argv, *flags, env={ORIGIN_ENV: fleet_origin()})


async def stream_node(conn, host: Host, command: str, started: float,
                      on_event: Callable[[Host, dict[str, Any]], None] | None = None,
                      stop: asyncio.Event | None = None) -> NodeRun:
    """Run `command` on an open connection, handing each JSON line to on_event as it arrives."""
    run = NodeRun(host)
    proc = await conn.create_process(command)
    stderr_task = asyncio.ensure_future(proc.stderr.read())
    async for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line from a node-side tool that is not ours: its stderr has the story
        if not isinstance(event, dict):
            continue
        run.events.append(event)
        if on_event is not None:
            on_event(host, event)
        if stop is not None and stop.is_set():
            proc.terminate()
    await proc.wait_closed()
    run.stderr = await stderr_task
    run.exit_status = proc.exit_status if proc.exit_status is not None else 255
    if run.exit_status == NOT_FOUND and "not found" in run.stderr:
        run.error = f"{command.split()[2] if command.startswith('env ') else command.split()[0]!r} not found on the node"
        run.hint = "install gpuwarden there, or set fleet.command / --remote-command"
    run.duration_s = time.monotonic() - started
    return run


def run_on_fleet(target: FleetTarget, rp: RemotePlaybook, *, dry_run: bool,
                 on_event: Callable[[Host, dict[str, Any]], None] | None = None,
                 on_node: Callable[[NodeRun], None] | None = None) -> list[NodeRun]:
    """The playbook on every node in parallel (bounded, per-node deadline); one NodeRun per node, in order."""
    command = command_line(target, rp, dry_run=dry_run)
    runs: dict[str, NodeRun] = {}

    async def job(conn, host: Host, started: float) -> HostResult:
        runs[host.name] = await stream_node(conn, host, command, started, on_event)
        return HostResult(host, runs[host.name].exit_status, duration_s=runs[host.name].duration_s)

    def finished(result: HostResult) -> None:
        if result.host.name not in runs or result.error:
            partial = runs.get(result.host.name) or NodeRun(result.host)
            partial.error, partial.hint, partial.duration_s = result.error, result.hint, result.duration_s
            runs[result.host.name] = partial
        if on_node is not None:
            on_node(runs[result.host.name])

    deadline = target.timeout if dry_run else max(target.timeout, ACTION_DEADLINE_S)
    asyncio.run(fan_out(list(target.hosts), job, target.ssh, parallel=target.parallel, timeout=deadline,
                        on_result=finished))
    return [runs[h.name] for h in target.hosts]


def exit_code(runs: list[NodeRun]) -> int:
    return max((r.exit_code for r in runs), default=0)
