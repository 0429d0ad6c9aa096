"""Run one collector step under a deadline: a command (killed with its whole process group) or a call.

A vendor tool stuck on a wedged GPU must never hold the bundle: commands run in their own session,
and at the timeout the group gets SIGKILL, so grandchildren holding the pipes die with it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from gpuwarden.ops.bundle.groupguard import GroupGuard

# After the kill, how long to wait for the pipes to drain before giving up on them.
DRAIN_AFTER_KILL_S = 0.5

# Commands still running, so that an interrupted bundle (Ctrl-C, an error) takes their process groups
# with it when gpuwarden exits: they lead their own sessions, so the terminal's Ctrl-C never reaches them.
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()
_exiting = False
# Kills the groups of commands still running if gpuwarden dies without running its atexit (SIGKILL, OOM).
_guard = GroupGuard()


def kill_running() -> None:
    """At exit: SIGKILL the process group of every command still running; none starts after this."""
    global _exiting
    with _running_lock:
        _exiting = True
        procs = list(_running)
    for proc in procs:
        _kill_group(proc)


atexit.register(kill_running)


@dataclass
class CommandResult:
    argv: list[str]
    stdout: bytes
    stderr: bytes
    exit_code: int | None
    timed_out: bool
    duration_s: float
    error: str | None = None  # could not start it at all (not installed, no permission)


def run_command(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> CommandResult:
    t0 = time.monotonic()
    # which() skips PATH entries this user cannot search; exec would report those as EACCES.
    exe = shutil.which(argv[0], path=(env or os.environ).get("PATH"))
    if exe is None:
        return CommandResult(argv, b"", b"", None, False, time.monotonic() - t0, f"{argv[0]}: not installed")
    # Started and registered under the lock: kill_running at exit either finds the command in _running or
    # keeps it from starting. (The thread is a daemon: once the interpreter exits it never runs again.)
    with _running_lock:
        if _exiting:
            return CommandResult(argv, b"", b"", None, False, time.monotonic() - t0, "not started: gpuwarden is exiting")
        _guard.start()  # before the tool: from its exec on, the guard can find it by its mark
        try:
            proc = subprocess.Popen([exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, env=_guard.environment(env),
                                    close_fds=True)
        except FileNotFoundError:
            return CommandResult(argv, b"", b"", None, False, time.monotonic() - t0, f"{argv[0]}: not installed")
        except PermissionError as exc:
            return CommandResult(argv, b"", b"", None, False, time.monotonic() - t0, f"{argv[0]}: {exc.strerror}")
        _running.add(proc)
        _guard.add(proc.pid)  # the child leads its own session: pgid == pid
    try:
        out, err = proc.communicate(timeout=max(0.01, timeout_s))
        return CommandResult(argv, out, err, proc.returncode, False, time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = b"", b""
        try:
            out, err = proc.communicate(timeout=DRAIN_AFTER_KILL_S)
        except subprocess.TimeoutExpired:
            # Something outside the group still holds the pipes; stop reading, keep nothing.
            for stream in (proc.stdout, proc.stderr):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            try:
                proc.wait(timeout=DRAIN_AFTER_KILL_S)
            except subprocess.TimeoutExpired:
                pass
        return CommandResult(argv, out or b"", err or b"", proc.returncode, True, time.monotonic() - t0,
                             f"timed out after {timeout_s:g}s; process group killed")
    finally:
        with _running_lock:
            _running.discard(proc)
        _guard.remove(proc.pid)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Reaped already (by its own thread, at exit): the pid may name another process now. Not poll(): that
    # would reap a leader whose children still hold the pipes, and leave them out of the group kill.
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: pgid == pid
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


class Worker:
    """A daemon thread running one call; join() waits up to a deadline and reports if it finished.

    Python cannot stop a thread blocked in a read of a hung sysfs file, so a late worker is simply
    abandoned: its result is dropped and the bundle goes on without it.
    """

    def __init__(self, name: str, fn: Callable[[], Any]):
        self.name = name
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.finished: float | None = None
        self._done = threading.Event()

        def body() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # reported in the manifest, never raised into the bundle
                self.error = exc
            finally:
                self.finished = time.monotonic()
                self._done.set()

        self._thread = threading.Thread(target=body, name=f"collect-{name}", daemon=True)
        self._thread.start()

    def wait_until(self, deadline: float) -> bool:
        return self._done.wait(max(0.0, deadline - time.monotonic()))

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def duration_s(self) -> float:
        return (self.finished or time.monotonic()) - self.started
