"""Run one command on many nodes at once: bounded concurrency, a deadline per node, a result per node.

A node that cannot be reached, or does not answer in time, is a result with its reason, never an exception.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

from gpuwarden.ops.fleet.inventory import Host
from gpuwarden.ops.fleet.ssh import SshSettings, Unreachable, connect

if TYPE_CHECKING:
    import asyncssh

NOT_FOUND = 127  # what a POSIX shell answers for a command it cannot find


@dataclass(frozen=True)
class HostResult:
    host: Host
    exit_status: int | None  # None: the command never ran (see error)
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    hint: str | None = None
    duration_s: float = 0.0

    @property
    def reached(self) -> bool:
        return self.error is None


# What fan_out runs per node: job(conn, host, started) on the node's open connection, its monotonic start time.
Job = Callable[["asyncssh.SSHClientConnection", Host, float], Awaitable[HostResult]]


async def run_command(conn: asyncssh.SSHClientConnection, host: Host, command: str, started: float) -> HostResult:
    """`command` through the node's shell on an open connection; stdout/stderr kept whole."""
    done = await conn.run(command, check=False)
    status = done.exit_status if done.exit_status is not None else 255
    stdout, stderr = _text(done.stdout), _text(done.stderr)
    if status == NOT_FOUND and "not found" in stderr:
        first = command.split()[0] if command.split() else command
        return HostResult(host, None, stdout, stderr, f"{first!r} not found on the node",
                          "install gpuwarden there, or set command = \"/path/to/gpuwarden\" in the fleet config "
                          "(--remote-command)", time.monotonic() - started)
    return HostResult(host, status, stdout, stderr, duration_s=time.monotonic() - started)


def _text(out: str | bytes | None) -> str:
    """A command's output as text: asyncssh decodes UTF-8 unless asked for bytes (never here); its type has both."""
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


async def _one(host: Host, ssh: SshSettings, timeout: float, job: Job, sem: asyncio.Semaphore) -> HostResult:
    async with sem:
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                conn = await connect(host, ssh)
                async with conn:
                    result = await job(conn, host, started)
                return result
        except Unreachable as exc:
            return HostResult(host, None, error=exc.message, hint=exc.hint, duration_s=time.monotonic() - started)
        except TimeoutError:
            return HostResult(host, None, error=f"no answer within {timeout:g}s (per-host --timeout)",
                              hint="the node or its sshd may hang; try `ssh` to it by hand",
                              duration_s=time.monotonic() - started)
        except OSError as exc:
            return HostResult(host, None, error=f"connection lost: {exc.strerror or exc}",
                              duration_s=time.monotonic() - started)
        except Exception as exc:  # an SSH library error mid-command: that node's result, not the fleet's end
            return HostResult(host, None, error=f"{type(exc).__name__}: {exc}", duration_s=time.monotonic() - started)


async def fan_out(hosts: list[Host], job: Job, ssh: SshSettings, *, parallel: int, timeout: float,
                  on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
    """`job(conn, host, started)` on every host, at most `parallel` at once; results in the hosts' order."""
    sem = asyncio.Semaphore(max(1, parallel))

    async def tracked(host: Host) -> HostResult:
        result = await _one(host, ssh, timeout, job, sem)
        if on_result is not None:
            on_result(result)
        return result

    return list(await asyncio.gather(*(tracked(h) for h in hosts)))


def run_everywhere(hosts: list[Host], command: str | Callable[[Host], str], ssh: SshSettings, *, parallel: int,
                   timeout: float, on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
    """A shell command (or one per host) on every host; blocks until each has answered or timed out."""
    def job(conn: asyncssh.SSHClientConnection, host: Host, started: float) -> Awaitable[HostResult]:
        return run_command(conn, host, command(host) if callable(command) else command, started)
    return asyncio.run(fan_out(hosts, job, ssh, parallel=parallel, timeout=timeout, on_result=on_result))
