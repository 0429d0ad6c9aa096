"""Removing the processes that keep residual VRAM: checked signals, zombie reaping, refusals that say why.

Every signal re-checks pid + start ticks right before it is sent and leaves a journal line; nothing else kills.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.node import procs
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.model import PROC_STATES

# Processes whose death takes the node (or other tenants) down with them: never signalled.
PROTECTED_COMMS = frozenset({
    "init", "systemd", "sshd", "kthreadd", "containerd", "dockerd", "containerd-shim",
    "containerd-shim-runc-v2", "containerd-shim-runc-v1", "docker-containerd-shim", "conmon", "crio",
    "runc", "crun", "kubelet", "tini", "dumb-init", "s6-svscan", "supervisord",
})
# The command line of a gpuwarden shim: killing one orphans the engine it supervises.
SHIM_MARKER = "gpuwarden.ops.services.shim"
# Container runtimes' per-container supervisors (comm is cut at 15 characters, so prefixes).
RUNTIME_SHIMS = ("containerd-shim", "conmon", "docker-containe")
PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


@dataclass(frozen=True)
class Target:
    """A process to remove; `start_ticks` is its identity as first seen."""

    pid: int
    start_ticks: int
    reason: str  # "zombie", "disk-sleep", "container-orphan", "dead-tenant", "operator" (asked for by hand)
    command: str = ""
    gpus: tuple[int, ...] = ()
    vram_bytes: int | None = None


@dataclass
class Outcome:
    pid: int
    reason: str
    result: str  # "removed", "gone", "skipped", "reported", "failed"
    detail: str
    next_step: str | None = None
    signals: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result in ("removed", "gone")


@dataclass(frozen=True)
class Stat:
    comm: str
    state: str  # PROC_STATES value
    ppid: int
    flags: int
    start_ticks: int


def read_stat(pid: int, proc_root: Path) -> Stat | None:
    """The few /proc/<pid>/stat fields the reaper decides on, or None when the process is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    split = procs.split_stat(text)
    if split is None or len(split[1]) < 20:
        return None
    comm, rest = split
    # ppid is field 4, flags field 9, starttime field 22.
    return Stat(comm=comm, state=PROC_STATES.get(rest[0], rest[0]), ppid=int(rest[1]),
                flags=int(rest[6]), start_ticks=int(rest[19]))


def target_ticks(pid: int, start_time: float | None, proc_root: Path = Path("/proc")) -> int | None:
    """The start ticks of `pid` if it is still the process that started at `start_time` (as a snapshot
    recorded it); None when it is gone or the PID now names a process that started at another time."""
    if start_time is None:
        return None
    st = read_stat(pid, proc_root)
    btime = procs.boot_time(proc_root)
    if st is None or btime is None:
        return None
    seen = btime + st.start_ticks / os.sysconf("SC_CLK_TCK")
    # Both sides come from the same btime + ticks sum; allow float rounding only.
    return st.start_ticks if abs(seen - start_time) < 0.5 / os.sysconf("SC_CLK_TCK") else None


def _uid(pid: int, proc_root: Path) -> int | None:
    try:
        return os.stat(f"{proc_root}/{pid}").st_uid
    except OSError:
        return None


def _cmdline(pid: int, proc_root: Path) -> str:
    return procs.command_line(pid, proc_root)


def _ancestors_of_self(proc_root: Path) -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = read_stat(pid, proc_root)
        if st is None:
            break
        pid = st.ppid
    return out


def container_managed(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """True when a container runtime's shim (containerd-shim, conmon) is among pid's ancestors.

    A process of a container whose shim is gone was reparented to init: nothing will ever stop it.
    """
    seen: set[int] = set()
    cur = pid
    while cur > 1 and cur not in seen:
        seen.add(cur)
        st = read_stat(cur, proc_root)
        if st is None:
            return False
        if st.comm.startswith(RUNTIME_SHIMS):
            return True
        cur = st.ppid
    return False


def namespace_init(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """True when pid is PID 1 of its own PID namespace (a container's init): NSpid ends in 1."""
    try:
        with open(f"{proc_root}/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False


def untouchable(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """Why `pid` must never be signalled by gpuwarden, or None when it may be.

    Not PID 1, not a kernel thread, not init/systemd/sshd/a container runtime or a gpuwarden shim,
    not gpuwarden itself or one of its ancestors, and the same user unless we are root.
    """
    if pid <= 1:
        return "it is PID 1 (init): killing it takes the node down"
    st = read_stat(pid, proc_root)
    if st is None:
        return None
    if st.flags & PF_KTHREAD or pid == 2 or st.ppid == 2:
        return "it is a kernel thread"
    if pid in _ancestors_of_self(proc_root):
        return "it is this gpuwarden or one of its parents"
    if st.comm in PROTECTED_COMMS or st.comm.startswith("containerd-shim"):
        return f"it is {st.comm}, which the node or its containers depend on"
    if namespace_init(pid, proc_root):
        return "it is the init (PID 1) of a container's PID namespace: ending it stops the whole container"
    cmd = _cmdline(pid, proc_root)
    if SHIM_MARKER in cmd:
        return "it is a gpuwarden shim: stop its engine with `gpuwarden engines stop` instead"
    uid = _uid(pid, proc_root)
    if os.geteuid() != 0 and uid is not None and uid != os.geteuid():
        return f"it belongs to another user (uid {uid}) and gpuwarden is not root"
    return None


class Reaper:
    """Removes targets one at a time. `progress` gets one-line notes (the playbook shows them)."""

    def __init__(self, settings: Settings, *, grace_s: float = 5.0, kill_wait_s: float = 5.0,
                 reap_wait_s: float = 0.5, orphan_wait_s: float = 5.0,
                 progress: Callable[[str], None] = lambda msg: None, end_parents: bool = True):
        self.settings = settings
        # False: a zombie's parent only ever gets SIGCHLD, never TERM/KILL (the agent's unattended policy).
        self.end_parents = end_parents
        self.proc_root = settings.proc_root
        self.grace_s = grace_s
        self.kill_wait_s = kill_wait_s
        self.reap_wait_s = reap_wait_s
        self.orphan_wait_s = orphan_wait_s
        self.progress = progress

    # --- the one place a signal is sent -------------------------------------------------------
    def send(self, pid: int, start_ticks: int, sig: int, *, role: str, target: int, why: str) -> str:
        """Send `sig` to pid only if it is still the process first seen. Returns "sent", "gone" or "denied"."""
        name = signal.Signals(sig).name
        if procs.identity(pid, self.proc_root) != start_ticks:
            journal.write(self.settings.state_dir, "reaper-signal", "skipped", pid=pid, signal=name, role=role,
                          target=target, reason="process gone or its PID now names another process")
            return "gone"
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            journal.write(self.settings.state_dir, "reaper-signal", "failed", pid=pid, signal=name, role=role,
                          target=target, reason="no permission")
            return "denied"
        journal.write(self.settings.state_dir, "reaper-signal", "ok", pid=pid, signal=name, role=role,
                      target=target, why=why)
        return "sent"

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        pause = 0.001  # most processes go within a millisecond of SIGTERM; stubborn ones get polled less
        while True:
            if done():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _exited(self, pid: int, ticks: int) -> bool:
        """True once pid no longer runs as that process (gone, reused, or a zombie awaiting its parent)."""
        st = read_stat(pid, self.proc_root)
        return st is None or st.start_ticks != ticks or st.state in ("zombie", "dead")

    def _gone(self, pid: int, ticks: int) -> bool:
        return procs.identity(pid, self.proc_root) != ticks

    # --- entry point ---------------------------------------------------------------------------
    def handle(self, target: Target) -> Outcome:
        st = read_stat(target.pid, self.proc_root)
        if st is None or st.start_ticks != target.start_ticks:
            journal.write(self.settings.state_dir, "reaper", "skipped", pid=target.pid, reason=target.reason,
                          why="process gone or its PID now names another process")
            return Outcome(target.pid, target.reason, "gone" if st is None else "skipped",
                           "already gone" if st is None else
                           "its PID now names another process (start time differs): left alone")
        if st.state in ("zombie", "dead"):
            return self.reap_zombie(target, st)
        if st.state == "disk-sleep":
            out = Outcome(target.pid, target.reason, "reported",
                          "in uninterruptible sleep (D): no signal can remove it until its I/O returns",
                          next_step=f"look at /proc/{target.pid}/stack and the storage or driver it waits on; "
                                    "if it never returns, only a reboot frees it")
            journal.write(self.settings.state_dir, "reaper", "reported", pid=target.pid, reason=target.reason,
                          state=st.state)
            return out
        return self.terminate(target)

    def terminate(self, target: Target, *, first: int = signal.SIGTERM) -> Outcome:
        """A live process that should be gone: TERM, grace, KILL (or KILL at once when `first` is SIGKILL);
        then reap it if it stays a zombie."""
        refusal = untouchable(target.pid, self.proc_root)
        if refusal:
            journal.write(self.settings.state_dir, "reaper", "reported", pid=target.pid, reason=target.reason,
                          why=refusal)
            return Outcome(target.pid, target.reason, "reported", f"not signalled: {refusal}",
                           next_step="stop it by hand if it really is a leftover")
        out = Outcome(target.pid, target.reason, "failed", "")
        result = self._term_then_kill(target.pid, target.start_ticks, role="holder", target=target.pid, out=out,
                                      first=first, why="the operator asked to stop it"
                                      if target.reason == "operator" else None)
        if result == "denied":
            out.detail = "no permission to signal it"
            out.next_step = "run gpuwarden as root or as its owner"
            return out
        # Its parent normally reaps it within moments; only a parent that does not gets SIGCHLD.
        if self._wait(lambda: self._gone(target.pid, target.start_ticks), self.reap_wait_s):
            out.result, out.detail = "removed", f"exited after {out.signals[-1] if out.signals else 'nothing'}"
            return out
        st = read_stat(target.pid, self.proc_root)
        if st is not None and st.state in ("zombie", "dead"):
            zombie = self.reap_zombie(target, st)
            zombie.signals[:0] = out.signals
            return zombie
        out.detail = "still there after SIGKILL"
        out.next_step = f"check /proc/{target.pid}/status; a process stuck in the driver needs a GPU reset"
        return out

    def _term_then_kill(self, pid: int, ticks: int, *, role: str, target: int, out: Outcome,
                        first: int = signal.SIGTERM, why: str | None = None) -> str:
        why = why or (f"{role} of residual VRAM" if role == "holder" else "parent does not reap its zombie child")
        if first == signal.SIGTERM:
            r = self.send(pid, ticks, signal.SIGTERM, role=role, target=target, why=why)
            if r != "sent":
                return r
            out.signals.append(f"SIGTERM->{pid}")
            self.progress(f"sent SIGTERM to {role} pid {pid}; waiting up to {self.grace_s:g}s")
            if self._wait(lambda: self._exited(pid, ticks), self.grace_s):
                return "exited"
        r = self.send(pid, ticks, signal.SIGKILL, role=role, target=target, why=why + " (grace over)")
        if r != "sent":
            return r
        out.signals.append(f"SIGKILL->{pid}")
        self.progress(f"sent SIGKILL to {role} pid {pid}")
        self._wait(lambda: self._exited(pid, ticks), self.kill_wait_s)
        return "exited"

    def reap_zombie(self, target: Target, st: Stat) -> Outcome:
        """Ask the parent to reap (SIGCHLD); if it will not and may be touched, end it so init reaps."""
        out = Outcome(target.pid, "zombie", "failed", "")
        ppid = st.ppid
        parent = read_stat(ppid, self.proc_root)
        if parent is None:
            out.result = "reported"
            out.detail = f"zombie whose parent pid {ppid} is gone and nobody reaps it"
            out.next_step = "its new parent (init) should reap it; if not, a reboot or GPU reset clears the VRAM"
            return out
        parent_cmd = _cmdline(ppid, self.proc_root) or f"[{parent.comm}]"
        if ppid > 1 and self.send(ppid, parent.start_ticks, signal.SIGCHLD, role="parent", target=target.pid,
                                  why="ask the parent to reap its zombie child") == "sent":
            out.signals.append(f"SIGCHLD->{ppid}")
            if self._wait(lambda: self._gone(target.pid, target.start_ticks), self.reap_wait_s):
                out.result, out.detail = "removed", f"reaped by its parent pid {ppid} after SIGCHLD"
                return out
        refusal = untouchable(ppid, self.proc_root) or (
            None if self.end_parents else "ending a live parent needs an operator (the agent only asks it to reap)")
        if refusal:
            out.result = "reported"
            out.detail = (f"zombie not reaped by its parent pid {ppid} ({parent_cmd[:60]}), "
                          f"which was left alone: {refusal}")
            out.next_step = (f"restart or fix pid {ppid} so it waits for its children; "
                             "or reset the GPU once it is drained")
            journal.write(self.settings.state_dir, "reaper", "reported", pid=target.pid, reason="zombie",
                          parent=ppid, why=refusal)
            return out
        self.progress(f"parent pid {ppid} ({parent_cmd[:40]}) does not reap zombie {target.pid}: ending the parent")
        r = self._term_then_kill(ppid, parent.start_ticks, role="parent", target=target.pid, out=out)
        if r == "denied":
            out.detail = f"no permission to signal parent pid {ppid}"
            out.next_step = "run gpuwarden as root or as the parent's owner"
            return out
        if self._wait(lambda: self._gone(target.pid, target.start_ticks), self.orphan_wait_s):
            out.result = "removed"
            out.detail = f"parent pid {ppid} ({parent_cmd[:40]}) ended; the zombie was reaped by its new parent"
            return out
        now = read_stat(target.pid, self.proc_root)
        out.result = "reported"
        out.detail = (f"parent pid {ppid} ended, but the zombie stays under pid {now.ppid if now else '?'}, "
                      "which does not reap it")
        out.next_step = "that process must reap it (or the node be rebooted); a GPU reset frees the VRAM meanwhile"
        return out
