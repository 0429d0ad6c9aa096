"""A watcher process that kills the bundle's vendor tools when the bundle dies, SIGKILL included.

Each tool leads its own process group (so a timeout kills its helpers too) and carries this bundle's mark in
its environment; the guard, started before the first tool, is told each group as it starts and ends, over a
pipe whose only write end the bundle holds. However the bundle dies, the kernel closes that end: the guard
reads EOF, SIGKILLs every group it was told of and every group with a marked process in it, and exits.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading

MARK_ENV = "GPUWARDEN_TOOL_MARK"  # NAME=<random> in each tool's environment, inherited by its helpers

# Why the mark as well as the list: a tool runs before the bundle can name its group to the guard (Popen
# returns after the exec), and a tool killed with its bundle in that window (rocm-smi had already forked its
# helper) was left running: the end-to-end test found exactly that, one tool in six, the last one started.
# The environment is set before the exec, so a tool is marked from its first instruction; a tool still
# between fork and exec shows its parent's environment, so the guard looks again until a look finds none.
# Why not PR_SET_PDEATHSIG in each tool: the death signal reaches only the tool itself, not the children it
# forks (rocm-smi is a Python script, amd-smi spawns helpers) that hold the GPU and the pipes; it fires when
# the *thread* that forked exits (the bundle runs tools from collector threads); and setting it between fork
# and exec needs preexec_fn, which is not safe in a program with threads, as a bundle is. The guard sits in
# its own session, so Ctrl-C or a kill of gpuwarden's process group does not take it first.
_GUARD = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
mark = sys.argv[1].encode()
groups = set()
for line in sys.stdin.buffer:
    sign, _, pgid = line.strip().partition(b" ")
    if pgid.isdigit():
        (groups.add if sign == b"+" else groups.discard)(int(pgid))

def kill(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass

def marked():
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            found.add(os.getpgid(int(name)))
        except OSError:
            continue
    return found

for pgid in groups:
    kill(pgid)
quiet = 0
deadline = time.monotonic() + 10
while quiet < 3 and time.monotonic() < deadline:
    found = marked()
    for pgid in found:
        kill(pgid)
    quiet = 0 if found else quiet + 1
    time.sleep(0.05)
"""


class GroupGuard:
    """The guard process of this gpuwarden (started before the first tool); add()/remove() name groups to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.mark = f"{MARK_ENV}={secrets.token_hex(16)}"
        self.failed: str | None = None  # why no guard runs (the tools still run; a SIGKILL may then leave them)

    def start(self) -> None:
        """Start the guard if it is not running yet (before the first tool: a tool is never unguarded)."""
        with self._lock:
            self._start()

    def environment(self, env: dict[str, str] | None) -> dict[str, str]:
        """A tool's environment: `env` (or ours) with this bundle's mark added."""
        name, _, value = self.mark.partition("=")
        return {**(os.environ if env is None else env), name: value}

    def _start(self) -> int | None:
        if self._pipe is not None or self.failed:
            return self._pipe
        read_end, write_end = os.pipe()  # both close-on-exec: no tool inherits the write end
        guard_env = {k: v for k, v in os.environ.items() if k != MARK_ENV}
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARD, self.mark], stdin=read_end,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=guard_env,
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
