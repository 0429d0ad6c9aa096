"""Who has an arena mapped: /proc/*/maps by device and inode, Rss/Pss from smaps, "registered" from the status protocol.

A mapper's registration is read from the status file its environment names (GPUWARDEN_STATUS_FILE, or the
file behind GPUWARDEN_STATUS_FD); without one it stays unknown (None).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.foundation.model import ArenaMapper
from gpuwarden.ops.node import procs
from gpuwarden.ops.node.procs import environ_vars
from gpuwarden.ops.foundation.records import record
from gpuwarden.ops.foundation.status_protocol import ENV_FD, ENV_FILE, read_events
from gpuwarden.ops.node.sim import registrations

# Phases after which the arena counts as registered, and those that say it is not (yet, or any more).
_REGISTERED = {"registered", "serving"}
_NOT_REGISTERED = {"starting", "mapping", "verifying", "registering", "stopping", "exited"}


@record
class FileId:
    path: str
    dev: tuple[int, int] | None  # (major, minor) as /proc/<pid>/maps prints it
    inode: int | None


def file_id(path: str | Path) -> FileId:
    # maps names the file by its resolved path, so a symlinked or relative arena path must be resolved too.
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return FileId(real, None, None)
    return FileId(real, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)


def _parse_maps_line(line: str) -> tuple[str, tuple[int, int], int, str] | None:
    """(perms, (major, minor), inode, pathname) of one maps line; None for anonymous ones."""
    parts = line.split(None, 5)
    if len(parts) < 6:
        return None
    try:
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        inode = int(parts[4])
    except ValueError:
        return None
    path = parts[5].rstrip("\n")
    if path.endswith(" (deleted)"):
        path = path[: -len(" (deleted)")]
    return parts[1], (major, minor), inode, path


def _matches(fid: FileId, dev: tuple[int, int], inode: int, path: str) -> bool:
    if fid.inode is not None and inode == fid.inode and dev == fid.dev:
        return True
    # A captured /proc tree or a vanished file: fall back to the name.
    return fid.inode is None and path == fid.path


def maps_file(pid: int, fid: FileId, proc_root: Path) -> bool:
    """True when process `pid` has the file mapped."""
    try:
        with open(f"{proc_root}/{pid}/maps", errors="replace") as f:
            for line in f:
                if fid.path.rsplit("/", 1)[-1] not in line:
                    continue
                parsed = _parse_maps_line(line)
                if parsed and _matches(fid, parsed[1], parsed[2], parsed[3]):
                    return True
    except OSError:
        return False
    return False


def usage(pid: int, fid: FileId, proc_root: Path) -> tuple[int | None, int | None]:
    """(Rss, Pss) in bytes of the process's mappings of the file, from /proc/<pid>/smaps."""
    rss = pss = 0
    inside = False
    try:
        with open(f"{proc_root}/{pid}/smaps", errors="replace") as f:
            for line in f:
                first = line.split(None, 1)[0] if line.strip() else ""
                if "-" in first and not first.endswith(":"):
                    parsed = _parse_maps_line(line)
                    inside = bool(parsed and _matches(fid, parsed[1], parsed[2], parsed[3]))
                    continue
                if not inside:
                    continue
                if line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None, None
    return rss, pss


def status_file_of(pid: int, proc_root: Path) -> Path | None:
    """The status-protocol file process `pid` writes, when its environment names one."""
    env = environ_vars(pid, proc_root, (ENV_FILE, ENV_FD))
    if env.get(ENV_FD, "").isdigit():
        try:
            target = os.readlink(f"{proc_root}/{pid}/fd/{env[ENV_FD]}")
            if target.startswith("/"):
                return Path(target)
        except OSError:
            pass
    if env.get(ENV_FILE):
        return Path(env[ENV_FILE])
    return None


def registration(pid: int, proc_root: Path) -> tuple[bool | None, int | None]:
    """(registered?, gpu) from the process's own status events; (None, None) when unknown."""
    path = status_file_of(pid, proc_root)
    if path is None:
        return None, None
    registered: bool | None = None
    gpu: int | None = None
    for event in read_events(path):
        if event.data.get("pid") not in (None, pid):
            continue
        for key in ("node_gpu", "gpu"):  # the node's numbering first, when the engine says it
            if isinstance(event.data.get(key), int):
                gpu = event.data[key]
                break
        if event.phase in _REGISTERED:
            registered = True
        elif event.phase in _NOT_REGISTERED:
            registered = False
    return registered, gpu


def _command(pid: int, proc_root: Path) -> str:
    return procs.command_line(pid, proc_root) or "?"


def _pids(proc_root: Path) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(proc_root) if n.isdigit())
    except OSError:
        return []


def _sim_registrations(state_dir: Path | None, path: str) -> dict[int, int]:
    """pid -> gpu of live sim-runtime registrations of this arena (the sim node's own record)."""
    if state_dir is None:
        return {}
    return {r["pid"]: r["gpu"] for r in registrations.list_all(state_dir)
            if not r["stale"] and r.get("arena") and os.path.realpath(r["arena"]) == os.path.realpath(path)}


def find_mappers(path: str | Path, proc_root: Path = Path("/proc"), *, with_usage: bool = True,
                 pids: list[int] | None = None, state_dir: Path | None = None) -> list[ArenaMapper]:
    """Every process (or those in `pids`) with the file mapped; Rss/Pss only when with_usage.

    "registered" comes from the mapper's status file, else from the sim node's records under state_dir.
    """
    fid = file_id(path)
    sim = _sim_registrations(state_dir, str(path))
    out = []
    for pid in (pids if pids is not None else _pids(proc_root)):
        if not maps_file(pid, fid, proc_root):
            continue
        rss, pss = usage(pid, fid, proc_root) if with_usage else (None, None)
        registered, gpu = registration(pid, proc_root)
        if registered is None and pid in sim:
            registered, gpu = True, sim[pid]
        out.append(ArenaMapper(pid=pid, command=_command(pid, proc_root), rss_bytes=rss, pss_bytes=pss,
                               registered=registered, gpu=gpu))
    return out


def shared_files(pid: int, proc_root: Path) -> set[str]:
    """Regular files the process maps shared (candidates for arenas)."""
    found = set()
    try:
        with open(f"{proc_root}/{pid}/maps", errors="replace") as f:
            for line in f:
                parsed = _parse_maps_line(line)
                if parsed and "s" in parsed[0] and parsed[3].startswith("/") and not parsed[3].startswith("/dev/dri"):
                    found.add(parsed[3])
    except OSError:
        pass
    return found
