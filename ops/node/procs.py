"""Reading processes from /proc (or a captured tree): identity, state, owner, container, GPU files.

Identity is (pid, start time): every kill path re-checks it so a reused PID is never signalled.
Static facts are cached per identity, so a refresh re-reads only each process's stat line.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import pwd
from pathlib import Path

from gpuwarden.ops.foundation import redact
from gpuwarden.ops.foundation.heldfiles import HeldFiles, open_or_none
from gpuwarden.ops.foundation.interrupts import signal_number as _signal_number
from gpuwarden.ops.foundation.model import PROC_STATES
from gpuwarden.ops.foundation.records import record
from gpuwarden.ops.foundation.safetext import printable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` reads processes through here
if TYPE_CHECKING:
    from typing import Callable

VISIBILITY_VARS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                   "GPU_DEVICE_ORDINAL", "NVIDIA_VISIBLE_DEVICES")

_CLK_TCK = os.sysconf("SC_CLK_TCK")


@record
class ProcInfo:
    pid: int
    start_time: float | None  # seconds since the epoch
    start_ticks: int  # raw field 22 of stat: exact, for identity checks
    state: str
    ppid: int
    uid: int | None
    user: str | None
    command: str
    cgroup: str | None
    container: str | None


def boot_time(proc_root: Path) -> float | None:
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return None


def _read_bytes(path: str) -> bytes | None:
    fd = open_or_none(path)  # out of descriptors raises: "cannot read" must not read as "process gone"
    if fd is None:
        return None
    try:
        return os.read(fd, 8192)
    except OSError:
        return None
    finally:
        os.close(fd)


def command_from(raw: bytes | None) -> str:
    """A process's command line as gpuwarden shows and stores it: secrets redacted, escapes made visible.

    The one reader of /proc/<pid>/cmdline for display: status, --json, holders, arena mappers, the reaper."""
    if not raw:
        return ""
    args = [a for a in raw.decode(errors="replace").split("\0") if a]
    return printable(redact.command_line(args)).strip()


def command_line(pid: int, proc_root: Path | str = "/proc") -> str:
    """command_from() for a PID ("" when it cannot be read)."""
    return command_from(_read_bytes(f"{proc_root}/{pid}/cmdline"))


def _read(path: str) -> str | None:
    raw = _read_bytes(path)
    return raw.decode(errors="replace") if raw is not None else None


@functools.lru_cache(maxsize=8)
def _prefixes(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The literal prefixes any match of these shell-style device patterns starts with."""
    return tuple(p[:min((p.find(c) for c in "*?[" if c in p), default=len(p))] for p in patterns)


@functools.lru_cache(maxsize=8)
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    """match(path) for shell-style device patterns (compiled only once a path has one of their prefixes)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match


def split_stat(text: str) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of a /proc/<pid>/stat line: rest[0] is field 3 (state), rest[i] field i + 3.

    comm may hold spaces and parentheses, so the fields start after the last ")".
    """
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < lpar:
        return None
    return text[lpar + 1:rpar], text[rpar + 2:].split()


def parse_stat(text: str) -> tuple[str, str, int, int] | None:
    """(comm, state letter, ppid, start ticks) from a /proc/<pid>/stat line."""
    split = split_stat(text)
    if split is None or len(split[1]) < 20:
        return None
    comm, rest = split
    return comm, rest[0], int(rest[1]), int(rest[19])


def container_of(cgroup_text: str | None) -> str | None:
    """A short container id from a cgroup path (docker, containerd/kubepods, podman), else None."""
    if not cgroup_text:
        return None
    for line in cgroup_text.splitlines():
        path = line.rsplit(":", 1)[-1]
        for part in reversed(path.split("/")):
            name = part
            for prefix in ("docker-", "libpod-", "cri-containerd-", "crio-"):
                if name.startswith(prefix):
                    name = name[len(prefix):]
            if name.endswith(".scope"):
                name = name[:-6]
            if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
                return name[:12]
    return None


def user_name(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class ProcReader:
    """Reads processes under a proc root; caches what cannot change for one (pid, start) identity."""

    def __init__(self, proc_root: Path = Path("/proc"), *, held: "HeldFiles | None" = None):
        self.root = proc_root
        self._root_s = str(proc_root)
        self._btime = boot_time(proc_root)
        self._static: dict[tuple[int, int], tuple[int | None, str, str | None, str | None]] = {}
        self._last: dict[int, tuple[ProcInfo, bytes]] = {}  # pid -> last answer and its state letter
        # When given, stat files of the processes read are kept open between refreshes.
        self._held = held
        self._users: dict[int | None, str | None] = {}  # uid -> name: passwd is read once per uid

    def _user(self, uid: int | None) -> str | None:
        name = self._users.get(uid)
        if name is None and uid not in self._users:
            name = self._users[uid] = user_name(uid)
        return name

    def pids(self) -> list[int]:
        try:
            return [int(n) for n in os.listdir(self._root_s) if n.isdigit()]
        except OSError:
            return []

    def read(self, pid: int) -> ProcInfo | None:
        """One process, or None when it does not exist (or vanished while being read).

        The same ProcInfo object comes back while state, parent and identity are unchanged, so callers
        can tell "nothing changed" by identity instead of comparing fields.
        """
        base = f"{self._root_s}/{pid}"
        if self._held is not None:
            raw = self._held.read(base + "/stat")
            if raw is None:  # the held fd's process is gone; the PID may name a new one now
                raw = self._held.read(base + "/stat")
        else:
            raw = _read_bytes(base + "/stat")
        if not raw:
            return None
        # comm may hold spaces and parentheses: the fields after it start past the last ")".
        rpar = raw.rfind(b")")
        rest = raw[rpar + 2:].split(None, 20)
        if rpar < 0 or len(rest) < 20:
            return None
        letter, ppid, ticks = rest[0], int(rest[1]), int(rest[19])
        last = self._last.get(pid)
        if last is not None and last[1] == letter and last[0].start_ticks == ticks and last[0].ppid == ppid:
            return last[0]
        key = (pid, ticks)
        static = self._static.get(key)
        if static is None:
            comm = raw[raw.find(b"(") + 1:rpar].decode(errors="replace")
            static = self._read_static(base, comm)
            self._static[key] = static
        uid, command, cgroup, container = static
        start = self._btime + ticks / _CLK_TCK if self._btime is not None else None
        state = letter.decode()
        info = ProcInfo(pid=pid, start_time=start, start_ticks=ticks, state=PROC_STATES.get(state, state),
                        ppid=ppid, uid=uid, user=self._user(uid), command=command, cgroup=cgroup,
                        container=container)
        self._last[pid] = (info, letter)
        return info

    def _read_static(self, base: str, comm: str) -> tuple[int | None, str, str | None, str | None]:
        try:
            uid: int | None = os.stat(base).st_uid
        except OSError:
            uid = None
        command = command_from(_read_bytes(base + "/cmdline")) or f"[{printable(comm)}]"
        cgroup_text = _read(base + "/cgroup")
        cgroup = None
        if cgroup_text:
            cgroup = cgroup_text.strip().splitlines()[-1].rsplit(":", 1)[-1] or None
        return uid, command, cgroup, container_of(cgroup_text)

    def forget_dead(self, live: set[int]) -> None:
        """Drop cached facts of PIDs no longer present (keeps the cache bounded)."""
        for key in [k for k in self._static if k[0] not in live]:
            del self._static[key]
        for pid in [p for p in self._last if p not in live]:
            del self._last[pid]
        if self._held is not None:
            for path in self._held.paths():
                name = path[len(self._root_s) + 1:].split("/", 1)[0]
                if name.isdigit() and int(name) not in live:
                    self._held.drop(path)

    def close(self) -> None:
        if self._held is not None:
            self._held.close()

    def open_files(self, pid: int, patterns: list[str], fds: dict[int, str] | None = None) -> tuple[str, ...]:
        """Device files matching `patterns` that the process holds open (deduplicated); `fds`, when given,
        gets every matching descriptor's number -> target (what DRM fdinfo is read through)."""
        # Every process of the node, one readlink per descriptor: through the directory's descriptor, which
        # spares the kernel a walk of /proc/<pid>/fd per link.
        try:
            fd_dir = os.open(f"{self._root_s}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return ()
        found: list[str] = []
        try:
            names = os.listdir(fd_dir)
            prefixes = _prefixes(tuple(patterns))
            for name in names:
                try:
                    target = os.readlink(name, dir_fd=fd_dir)
                except OSError:
                    continue
                # Most descriptors are sockets, pipes and files: a prefix test spares the pattern for them.
                if target.startswith(prefixes) and _matcher(tuple(patterns))(target):
                    if fds is not None and name.isdigit():
                        fds[int(name)] = target
                    if target not in found:
                        found.append(target)
        except OSError:
            return ()
        finally:
            os.close(fd_dir)
        return tuple(sorted(found))

    def visibility(self, pid: int) -> dict[str, str]:
        """GPU visibility variables from the environment; nothing else of it is kept."""
        return environ_vars(pid, self._root_s, VISIBILITY_VARS)


def environ_vars(pid: int, proc_root: Path | str, names: tuple[str, ...]) -> dict[str, str]:
    """The variables among `names` in a process's environment; {} when it cannot be read."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    wanted = {n.encode() for n in names}
    out = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name in wanted:
            out[name.decode()] = value.decode(errors="replace")
    return out


def group_members(pgid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """PIDs whose process group is `pgid` (field 5 of stat), zombies included."""
    out = []
    for name in os.listdir(proc_root):
        text = _read(f"{proc_root}/{name}/stat") if name.isdigit() else None
        split = split_stat(text) if text else None
        if split is not None and len(split[1]) > 2 and split[1][2] == str(pgid):
            out.append(int(name))
    return out


def stat_facts(pid: int, proc_root: Path = Path("/proc")) -> tuple[str, str, int, int] | None:
    """(comm, state letter, ppid, start ticks) of `pid` now, or None when no such process exists."""
    text = _read(f"{proc_root}/{pid}/stat")
    return parse_stat(text) if text else None


def identity(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The start ticks of `pid` now, or None when no such process exists."""
    parsed = stat_facts(pid, proc_root)
    return parsed[3] if parsed else None


def state_of(pid: int, proc_root: Path = Path("/proc")) -> str:
    parsed = stat_facts(pid, proc_root)
    return PROC_STATES.get(parsed[1], parsed[1]) if parsed else "gone"


# The signals an operator may send from the console, with what each does to a process that does not handle it.
SIGNALS = {
    "TERM": "asks it to exit (the polite stop: engines drain and free their memory)",
    "INT": "interrupts it, as Ctrl-C does (most programs exit)",
    "HUP": "hangs it up: exits, unless it handles HUP (many daemons reload their config)",
    "USR1": "ends it unless it handles USR1 (then it does what its author chose: dump state, rotate logs)",
    "USR2": "ends it unless it handles USR2 (then it does what its author chose)",
    "QUIT": "ends it with a core dump where core dumps are on (a stuck Python prints no traceback)",
    "STOP": "freezes it until CONT: it keeps its memory and GPU contexts, and its peers may time out",
    "CONT": "lets a stopped process run again",
    "KILL": "ends it at once: no cleanup, cannot be caught",
}
# Signals whose default action ends or freezes the process: the console asks first.
_ENDS = frozenset({"TERM", "INT", "HUP", "USR1", "USR2", "QUIT", "STOP", "KILL"})
_UNCATCHABLE = frozenset({"KILL", "STOP"})


def signal_number(name: str) -> int:
    """The number of a signal named "TERM" (or "SIGTERM"); KeyError for no such signal."""
    number = _signal_number(name)
    if number is None:
        raise KeyError(name)
    return number


def ends_or_freezes(name: str, caught: frozenset[int] = frozenset(), ignored: frozenset[int] = frozenset()) -> bool:
    """Whether sending `name` ends or freezes a process with these handled/ignored signals (its default action
    runs); USR1/USR2 it catches or ignores do not (the other terminating ones still ask it to stop)."""
    if name not in _ENDS:
        return False
    number = signal_number(name)
    if name in ("USR1", "USR2") and (number in caught or number in ignored):
        return False
    return name in _UNCATCHABLE or number not in ignored


def _mask(text: str) -> frozenset[int]:
    """Signal numbers of a SigCgt/SigIgn hex mask of /proc/<pid>/status (bit n-1 is signal n)."""
    try:
        bits = int(text, 16)
    except ValueError:
        return frozenset()
    return frozenset(n + 1 for n in range(64) if bits >> n & 1)


def details(pid: int, proc_root: Path | str = "/proc") -> dict[str, object] | None:
    """What the console's process view shows beyond the snapshot: the whole command line (redacted), cwd, owner,
    parent, threads, the signals it handles and ignores; None when the process is gone. Reads /proc/<pid>/cmdline,
    which can wait on a process's memory lock: call it off the event loop."""
    base = f"{proc_root}/{pid}"
    status = _read(base + "/status")
    if status is None:
        return None
    fields = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    try:
        with open(base + "/cmdline", "rb") as f:
            raw = f.read(1 << 17)
    except OSError:
        raw = b""
    try:
        cwd: str | None = printable(os.readlink(base + "/cwd"))
    except OSError as exc:
        cwd = None if exc.errno != 13 else "(not permitted: run as its user or root)"
    uid = fields.get("Uid", "").split()
    return {
        "command": command_from(raw) or f"[{printable(fields.get('Name', '?'))}]",
        "cwd": cwd,
        "uid": int(uid[0]) if uid and uid[0].isdigit() else None,
        "user": user_name(int(uid[0])) if uid and uid[0].isdigit() else None,
        "ppid": int(fields["PPid"]) if fields.get("PPid", "").isdigit() else None,
        "threads": int(fields["Threads"]) if fields.get("Threads", "").isdigit() else None,
        "state": fields.get("State"),
        "caught": _mask(fields.get("SigCgt", "")),
        "ignored": _mask(fields.get("SigIgn", "")),
    }
