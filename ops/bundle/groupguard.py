"""A watcher process that kills the bundle's vendor-tool process groups when the bundle dies, SIGKILL included.

Each tool leads its own process group (so a timeout kills its helpers too); the guard, started once, is told
each group as it starts and ends, over a pipe whose only write end the bundle holds. However the bundle dies,
the kernel closes that end: the guard reads EOF, SIGKILLs every group still running, and exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

# Why a guard process and not PR_SET_PDEATHSIG in each tool: the death signal reaches only the tool itself, not
# the children it forks (rocm-smi is a Python script, amd-smi spawns helpers) that hold the GPU and the pipes;
# it fires when the *thread* that forked exits, not the process; and setting it between fork and exec needs
# preexec_fn, which is not safe in a program with threads, as a bundle is. The guard sits in its own session,
# so Ctrl-C or a kill of gpuwarden's process group does not take it first.
_GUARD = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin.buffer:
    sign, _, pgid = line.strip().partition(b" ")
    if pgid.isdigit():
        (groups.add if sign == b"+" else groups.discard)(int(pgid))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class GroupGuard:
    """The guard process of this gpuwarden (started at the first tool); add()/remove() name groups to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: int | None = None
        self._proc: subprocess.Popen | None = None
        self.failed: str | None = None  # why no guard runs (the tools still run; a SIGKILL may then leave them)

    def _start(self) -> int | None:
        if self._pipe is not None or self.failed:
            return self._pipe
        read_end, write_end = os.pipe()  # both close-on-exec: no tool inherits the write end
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARD], stdin=read_end,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True, close_fds=True)
        except OSError as exc:
            os.close(write_end)
            self.failed = f"the tool guard did not start: {exc.strerror or exc}"
            return None
        finally:
            os.close(read_end)
        self._pipe = write_end
        return write_end

    def _say(self, line: str) -> None:
        with self._lock:
            fd = self._start()
            if fd is None:
                return
            try:
                os.write(fd, line.encode())  # a line is far under PIPE_BUF: written whole
            except OSError as exc:
                self.failed = f"the tool guard went away: {exc.strerror or exc}"

    def add(self, pgid: int) -> None:
        self._say(f"+ {pgid}\n")

    def remove(self, pgid: int) -> None:
        """Before the group's leader is reaped (its id cannot be reused while the guard may still kill it)."""
        self._say(f"- {pgid}\n")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None
