"""The processes a playbook may signal, named before it runs: pid, user, role, redacted command, signals.

The reaper sends nothing a plan does not list (issue 35, "nothing signalled unseen"); the runner shows the plan
before any step and journals it, with what was really sent, after the run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from gpuwarden.ops.node import procs
from gpuwarden.ops.clean.reaper import SHIM_MARKER, command_parts, namespace_init, read_stat
from gpuwarden.ops.engines import state as st

# Roles, as --json shows them; ROLE_TEXT is how a person reads them.
ENGINE, LAUNCHER, CONTAINER_INIT, UNIT_MAIN, INIT, PLAIN = (
    "supervised-engine", "engine-launcher", "container-init", "unit-main", "init", "plain")
ROLE_TEXT = {ENGINE: "supervised engine", LAUNCHER: "launcher of a supervised engine",
             CONTAINER_INIT: "PID 1 of a container", UNIT_MAIN: "main process of a systemd unit",
             INIT: "PID 1 (init)", PLAIN: "plain process"}
# Ending one of these takes down more than the process: an engine others rely on, a whole container, a service
# systemd would restart or mark failed, the node. Only an operator's --end-parents allows it; policies never do.
GUARDED = frozenset({ENGINE, CONTAINER_INIT, UNIT_MAIN, INIT})
ENDING = frozenset({"SIGTERM", "SIGKILL", "SIGINT", "SIGQUIT", "SIGHUP"})
COMMAND_WIDTH = 160  # what a plan line shows of a command; --json and the journal keep the whole (redacted) line

MainPid = Callable[[str, bool], "int | None"]  # (unit, user manager?) -> MainPID, None when it cannot be asked


def systemd_main_pid(unit: str, user_manager: bool) -> int | None:
    """The unit's MainPID as its manager reports it (`systemctl show -p MainPID --value`); None when unknown.

    A user unit's manager is not ours to ask from here (it needs that user's bus): None."""
    exe = shutil.which("systemctl")
    if exe is None or user_manager:
        return None
    try:
        out = subprocess.run([exe, "show", "--property=MainPID", "--value", "--", unit], capture_output=True,
                             text=True, timeout=3.0, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    value = out.stdout.strip()
    return int(value) if out.returncode == 0 and value.isdigit() else None


def unit_of(pid: int, proc_root: Path) -> tuple[str, bool] | None:
    """(the systemd service whose cgroup holds pid, whether a user manager runs it), or None.

    /proc/PID/cgroup's unified line ("0::/system.slice/foo.service") names the unit as its last .service part;
    a path through user@UID.service belongs to that user's manager."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.rsplit(":", 1)[-1].split("/")
        services = [p for p in parts if p.endswith(".service")]
        if services and (line.startswith("0::") or "name=systemd" in line):
            unit = services[-1]
            return unit, unit != services[0] or unit.startswith("user@")
    return None


@dataclass
class Entry:
    """One process a plan may signal, and what it will be sent."""

    pid: int
    start_ticks: int
    user: str | None
    uid: int | None
    role: str
    program: str
    command: str  # redacted, program name first
    signals: list[str]  # in the order they may be sent
    why: str
    name: str | None = None  # the unit (UNIT_MAIN) or the engine (ENGINE, LAUNCHER) it is for
    condition: str = ""  # when the later signals are sent ("only if it does not reap pid 4426")
    withheld: str = ""  # what the plan will not do to it, and what would allow it
    sent: list[str] = field(default_factory=list)  # filled in as the run goes

    def role_text(self) -> str:
        text = ROLE_TEXT.get(self.role, self.role)
        return f"{text} {self.name}" if self.name else text

    def line(self) -> str:
        """The plan line a person reads: pid, user, role, command (program first), then the signals."""
        cmd = self.command if len(self.command) <= COMMAND_WIDTH else self.command[:COMMAND_WIDTH - 1] + "…"
        sigs = ", ".join(self.signals) if self.signals else "no signal"
        tail = f" ({self.condition})" if self.condition and len(self.signals) > 1 else ""
        held = f"; {self.withheld}" if self.withheld else ""
        return (f"pid {self.pid} ({self.user or '?'}, {self.role_text()}): {cmd} — {sigs}{tail}: "
                f"{self.why}{held}")

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "user": self.user, "uid": self.uid, "role": self.role,
                **({"unit" if self.role == UNIT_MAIN else "engine": self.name} if self.name else {}), "program": self.program, "command": self.command,
                "signals": list(self.signals), "why": self.why,
                **({"condition": self.condition} if self.condition else {}),
                **({"withheld": self.withheld} if self.withheld else {}),
                "sent": list(self.sent)}


class SignalPlan:
    """Every process one playbook run may signal; the reaper asks `allows` before each signal."""

    def __init__(self, entries: Iterable[Entry] = ()):
        self.entries: list[Entry] = []
        for e in entries:
            self.add(e)

    def add(self, entry: Entry) -> Entry:
        """Add a process, or merge its signals into the one already planned for the same process."""
        for e in self.entries:
            if e.pid == entry.pid and e.start_ticks == entry.start_ticks:
                e.signals += [s for s in entry.signals if s not in e.signals]
                e.why = e.why if entry.why in e.why else f"{e.why}; {entry.why}"
                return e
        self.entries.append(entry)
        return entry

    def find(self, pid: int, start_ticks: int) -> Entry | None:
        return next((e for e in self.entries if e.pid == pid and e.start_ticks == start_ticks), None)

    def allows(self, pid: int, start_ticks: int, signal_name: str) -> Entry | None:
        e = self.find(pid, start_ticks)
        return e if e is not None and signal_name in e.signals else None

    def record(self, pid: int, start_ticks: int, signal_name: str) -> None:
        e = self.find(pid, start_ticks)
        if e is not None:
            e.sent.append(signal_name)

    def to_list(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.entries]

    def lines(self) -> list[str]:
        return [e.line() for e in self.entries]


def describe_entries(entries: list[dict[str, Any]]) -> list[str]:
    """Entry.line() for entries as --json and the journal keep them (to_dict)."""
    names = set(Entry.__dataclass_fields__) - {"name", "start_ticks"}
    return [Entry(**{k: v for k, v in e.items() if k in names}, name=e.get("unit") or e.get("engine"),
                  start_ticks=0).line() for e in entries]


def _owner(pid: int, proc_root: Path) -> int | None:
    try:
        return os.stat(proc_root / str(pid)).st_uid
    except OSError:
        return None


def engine_pids(state_dir: Path, proc_root: Path) -> tuple[dict[int, str], dict[int, str]]:
    """({engine pid: name}, {shim pid: name}) of the supervised engines whose records say they run."""
    engines: dict[int, str] = {}
    shims: dict[int, str] = {}
    for name in st.names(state_dir):
        rec = st.read_state(state_dir, name) or {}
        if isinstance(rec.get("pid"), int) and st.alive(rec["pid"], rec.get("pid_start"), proc_root):
            engines[rec["pid"]] = name
        if isinstance(rec.get("shim_pid"), int) and st.alive(rec["shim_pid"], rec.get("shim_start"), proc_root):
            shims[rec["shim_pid"]] = name
    return engines, shims


class Classifier:
    """Tells the role of a process: what else its end takes down. Engine records and unit lookups are read once."""

    def __init__(self, proc_root: Path, state_dir: Path | None = None, *, main_pid: MainPid = systemd_main_pid):
        self.proc_root = proc_root
        self.main_pid = main_pid
        self._engines, self._shims = engine_pids(state_dir, proc_root) if state_dir else ({}, {})
        self._units: dict[tuple[str, bool], int | None] = {}

    def role(self, pid: int) -> tuple[str, str | None]:
        """(role, unit or engine name or None)."""
        if pid == 1:
            return INIT, None
        if pid in self._engines:
            return ENGINE, self._engines[pid]
        if pid in self._shims or SHIM_MARKER in procs.command_line(pid, self.proc_root):
            return LAUNCHER, self._shims.get(pid)
        if namespace_init(pid, self.proc_root):
            return CONTAINER_INIT, None
        unit = unit_of(pid, self.proc_root)
        if unit is not None and self._is_main(pid, unit):
            return UNIT_MAIN, unit[0]
        return PLAIN, None

    def _is_main(self, pid: int, unit: tuple[str, bool]) -> bool:
        if unit not in self._units:
            self._units[unit] = self.main_pid(*unit)
        main = self._units[unit]
        if main is not None:
            return main == pid
        # No manager to ask: systemd forks a service's main process itself, so a process of the unit whose parent
        # is the manager (PID 1, or a process named systemd) is taken for it. Erring this way asks for --end-parents.
        st = read_stat(pid, self.proc_root)
        if st is None:
            return False
        parent = read_stat(st.ppid, self.proc_root)
        return st.ppid == 1 or (parent is not None and parent.comm == "systemd")

    def entry(self, pid: int, start_ticks: int, signals: list[str], why: str, *, condition: str = "",
              end_guarded: bool = False) -> Entry:
        """The plan entry for pid; ending signals are withheld from a guarded role unless `end_guarded`."""
        role, name = self.role(pid)
        uid = _owner(pid, self.proc_root)
        program, command = command_parts(pid, self.proc_root)
        withheld = ""
        if role in GUARDED and not end_guarded and any(s in ENDING for s in signals):
            dropped = [s for s in signals if s in ENDING]
            signals = [s for s in signals if s not in ENDING]
            withheld = (f"not ended ({', '.join(dropped)} withheld): it is the {ROLE_TEXT[role]}"
                        + (f" {name}" if name else "") + "; only an operator's --end-parents ends it")
        return Entry(pid, start_ticks, procs.user_name(uid), uid, role, program, command, signals, why,
                     name=name, condition=condition,
                     withheld=withheld)


def engine_entries(classifier: Classifier, state_dir: Path, names: Iterable[str], *, allowed: bool,
                   grace_s: float | None = None) -> list[Entry]:
    """The shim and engine processes that stopping these engines signals (ops.engines.control.stop: SIGTERM to
    the shim, which sends the engine's stop signal, then SIGKILL; both directly when the shim is wedged or gone).

    allowed=False (an unattended policy): listed with every signal withheld, so the plan says what it will not do.
    """
    # deferred: keeps `gpuwarden reset --help` cheap (12.8 ms there)
    from gpuwarden.ops.config.nodeconfig import EngineConfig, signal_number
    out = []
    for name in names:
        rec = st.read_state(state_dir, name) or {}
        spec = st.read_spec(state_dir, name) or {}
        try:
            engine = EngineConfig.from_dict(spec.get("engine", {"name": name, "argv": ["?"]}))
            stop_signal = signal.Signals(signal_number(engine.stop_signal)).name
            grace = engine.stop_grace if grace_s is None else grace_s
        except Exception:  # a spec this version cannot read: the defaults control.stop would also fall back on
            stop_signal, grace = "SIGTERM", grace_s if grace_s is not None else 30.0
        shim, shim_start = rec.get("shim_pid"), rec.get("shim_start")
        pid, pid_start = rec.get("pid"), rec.get("pid_start")
        for p, start, sigs, why, cond in (
                (shim, shim_start, ["SIGTERM", "SIGKILL"], f"the shim of engine {name}: SIGTERM asks it to stop "
                 "the engine", f"SIGKILL only if it has not finished {grace + 5:g}s later"),
                (pid, pid_start, [stop_signal, "SIGKILL"], f"engine {name} (its process group)",
                 f"SIGKILL after its {grace:g}s stop grace; sent by its shim, or by gpuwarden when the shim is gone")):
            if not isinstance(p, int) or not st.alive(p, start, classifier.proc_root):
                continue
            ticks = procs.identity(p, classifier.proc_root)
            if ticks is None:
                continue
            e = classifier.entry(p, ticks, list(dict.fromkeys(sigs)), why, condition=cond, end_guarded=allowed)
            if not allowed:
                e.signals = []
                e.withheld = (f"not stopped: an unattended policy never ends a supervised engine; stop it with "
                              f"`gpuwarden engines stop {name}` or `gpuwarden drain` by hand")
            out.append(e)
    return out
