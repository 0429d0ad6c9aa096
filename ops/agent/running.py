"""Which agent runs for a state dir, and stopping it: what `gpuwarden agent status|stop|restart` rely on.

The agent holds an exclusive flock on <state dir>/agent/lock for its whole life and writes its PID there
(daemon.Agent._lock): a held lock is a running agent, whatever the PID file says after a crash.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.errors import GpuwardenError

LOCK = ("agent", "lock")  # under the state dir; the same path daemon.Agent._lock takes
STOP_TIMEOUT_S = 10.0  # the agent stops within 2 s of SIGTERM (its docs); this is for a node under load


@dataclass(frozen=True)
class Running:
    """The agent that holds the lock: its PID, command line and the GPUWARDEN_* environment it runs with."""

    pid: int
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    unit: str | None = None  # the systemd service it runs under, if any


def lock_path(state_dir: Path) -> Path:
    return Path(state_dir).joinpath(*LOCK)


def _held(path: Path) -> bool | None:
    """True when someone holds the lock, False when nobody does, None when there is no lock file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GpuwardenError(f"cannot read the agent's lock {path}: {exc.strerror}",
                             "run as the state dir's owner (root for /run/gpuwarden)") from None
    try:
        # A shared lock, dropped at once: it fails only while the agent holds its exclusive one. An agent
        # starting in this instant would see the lock taken and refuse; `start` never probes while it starts one.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _read(path: Path, limit: int = 1 << 16) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


def _unit(pid: int) -> str | None:
    """The systemd service `pid` runs in (cgroup v2 or v1's name=systemd line), e.g. gpuwarden-agent.service."""
    try:
        text = _read(Path(f"/proc/{pid}/cgroup")).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        hierarchy, _, cgroup = line.partition(":")[2].partition(":")
        if hierarchy in ("", "name=systemd"):
            for part in reversed(cgroup.split("/")):
                if part.endswith(".service") and part != "init.scope":
                    return part
    return None


def find(state_dir: Path) -> Running | None:
    """The agent running for `state_dir`, or None. Its PID comes from the lock file it holds."""
    path = lock_path(state_dir)
    if not _held(path):
        return None
    try:
        pid = int(_read(path, 32).decode().strip())
    except (OSError, ValueError):
        raise GpuwardenError(f"an agent holds {path} but the file names no PID",
                             "find it with `fuser -v` on that file") from None
    try:
        argv = tuple(a.decode(errors="replace") for a in _read(Path(f"/proc/{pid}/cmdline")).split(b"\0") if a)
    except OSError:
        argv = ()
    env: dict[str, str] = {}
    try:
        for item in _read(Path(f"/proc/{pid}/environ"), 1 << 20).split(b"\0"):
            key, sep, value = item.decode(errors="replace").partition("=")
            if sep and key.startswith("GPUWARDEN_"):
                env[key] = value
    except OSError:
        pass  # another user's agent: its environment is not ours to read
    return Running(pid, argv, env, _unit(pid))


def _is_agent(run: Running, state_dir: Path) -> bool:
    """Still the same agent: the lock still held and still naming this PID (checked right before the signal)."""
    try:
        return bool(_held(lock_path(state_dir))) and int(_read(lock_path(state_dir), 32).strip() or 0) == run.pid
    except (OSError, ValueError):
        return False


def refuse_managed(run: Running, verb: str) -> None:
    """An agent systemd runs would be started again by systemd (Restart=always): say what to run instead."""
    if run.unit:
        raise GpuwardenError(f"the agent (pid {run.pid}) runs under systemd as {run.unit}: gpuwarden does not {verb} it",
                      f"systemctl {verb} {run.unit.removesuffix('.service')}")


def stop(state_dir: Path, run: Running, timeout_s: float = STOP_TIMEOUT_S) -> float:
    """SIGTERM the agent `run` names and wait until it has exited; the seconds it took. The PID is pinned with a
    pidfd and checked against the lock before the signal, so a PID reused meanwhile is never signalled."""
    try:
        pidfd = os.pidfd_open(run.pid)
    except ProcessLookupError:
        return 0.0  # gone already
    try:
        if not _is_agent(run, state_dir):
            return 0.0  # it exited (and maybe another started) between find() and now: nothing of ours to stop
        journal.write(state_dir, "agent-stop", "started", agent_pid=run.pid, signal="SIGTERM")
        started = time.monotonic()
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        except ProcessLookupError:
            return 0.0
        except PermissionError:
            raise GpuwardenError(f"no permission to signal the agent (pid {run.pid})",
                                 "run as its user (root for /run/gpuwarden)") from None
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)  # a pidfd is readable once its process has exited
        if not poller.poll(timeout_s * 1000):
            journal.write(state_dir, "agent-stop", "failed", agent_pid=run.pid, waited_s=timeout_s)
            raise GpuwardenError(f"the agent (pid {run.pid}) did not stop within {timeout_s:g}s of SIGTERM",
                                 f"see {Path(state_dir) / 'agent' / 'agent.log'}; `kill -KILL {run.pid}` ends it")
        took = time.monotonic() - started
        # Its exit released the lock; a child of ours reaped here would otherwise linger as a zombie.
        try:
            os.waitpid(run.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        except OSError as exc:
            if exc.errno != errno.ECHILD:
                raise
        journal.write(state_dir, "agent-stop", "ok", agent_pid=run.pid, took_s=round(took, 3))
        return took
    finally:
        os.close(pidfd)
