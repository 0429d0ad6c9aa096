"""Host memory for the arena: its filesystem's room, RLIMIT_MEMLOCK, the KFD registration budget, THP, swap.

Facts: tmpfs without size= is half of RAM (Documentation/filesystems/tmpfs.rst), and /proc/mounts shows size= only
when it differs from that default; /proc/<pid>/limits "Max locked memory" in bytes; limits.conf memlock in KiB
(pam_limits(8)); systemd LimitMEMLOCK= (systemd.exec(5)); THP modes in /sys/kernel/mm/transparent_hugepage (the
bracketed word is the active one); the KFD budget arithmetic lives in ops/arena/budget.py.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import resource

from gpuwarden.ops.arena import budget as kfd_budget
from gpuwarden.ops.arena.format import DEFAULT_CHUNK, chunk_count_for, header_size_for, load_header
from gpuwarden.ops.engines import state as engine_state
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.config.nodeconfig import ArenaConfig
from gpuwarden.ops.foundation.units import fmt_bytes, parse_kernel_size
from gpuwarden.ops.doctor.model import Result, fail, passed, skip, unknown, warn
from gpuwarden.ops.doctor.node import is_live_proc, meminfo, node_config
from gpuwarden.ops.doctor.probe import CheckIO


def _arena(io: CheckIO) -> ArenaConfig | None:
    cfg = node_config(io)
    return None if cfg is None else cfg.arena


def _arena_bytes(arena: ArenaConfig, live: bool = True) -> int | None:
    """Bytes the arena file takes: header + payload (from its header when the config gives no size)."""
    if not arena.size:
        if not live:
            return None  # the file on this machine is not the captured node's
        try:
            h = load_header(arena.path)
            return h.header_size + h.payload_size
        except (GpuwardenError, OSError):
            return None
    return header_size_for(chunk_count_for(arena.size, DEFAULT_CHUNK)) + arena.size


def _mount_of(io: CheckIO, path: str) -> tuple[str, str, dict[str, str]] | None:
    """(mount point, fs type, options) of the mount holding `path`, from /proc/self/mounts."""
    text = io.text("proc", "self/mounts") or io.text("proc", "mounts") or ""
    best = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) > len(best[0]):
                opts = dict(o.partition("=")[::2] for o in parts[3].split(","))
                best = (point, parts[2], opts)
    return best


def _tmpfs_size(opts: dict[str, str], ram: int | None) -> int | None:
    raw = opts.get("size")
    if raw is None:
        return ram // 2 if ram else None  # tmpfs default: half of RAM
    if raw.endswith("%"):
        return ram * int(raw[:-1]) // 100 if ram else None
    try:
        return parse_kernel_size(raw)  # /proc/mounts writes it as size=1048576k (KiB)
    except GpuwardenError:
        return None


def _capacity(io: CheckIO, path: str) -> tuple[int | None, int | None, str]:
    """(filesystem size, bytes free for the arena, how it was found) for the directory of `path`."""
    directory = os.path.dirname(path) or "/"
    if is_live_proc(io):
        io.note(f"statvfs({directory})")
        try:
            st = os.statvfs(directory)
        except OSError:
            return None, None, f"statvfs({directory}) failed"
        free = st.f_bavail * st.f_frsize
        try:
            free += os.stat(path).st_blocks * 512  # the arena already there gives its room back when replaced
        except OSError:
            pass
        return st.f_blocks * st.f_frsize, free, f"statvfs({directory})"
    mount = _mount_of(io, directory)
    if mount is None or mount[1] != "tmpfs":
        return None, None, "not a tmpfs in /proc/mounts (free space of a disk is not in a captured tree)"
    return _tmpfs_size(mount[2], meminfo(io).get("MemTotal")), None, f"{mount[1]} {mount[0]} in /proc/mounts"


def check_arena_fs(io: CheckIO) -> Result:
    arena = _arena(io)
    if arena is None:
        return skip("no [arena] in the node config")
    need = _arena_bytes(arena, is_live_proc(io))
    if need is None:
        return unknown(f"the config gives no arena size and {arena.path} has no readable header here")
    total, free, how = _capacity(io, arena.path)
    where = os.path.dirname(arena.path) or "/"
    details = {"arena": arena.path, "needs": need, "filesystem_size": total, "free": free, "source": how}
    fix = (f"mount -o remount,size={-(-need * 5 // 4 >> 30)}G {where}  (and in /etc/fstab: "
           f"tmpfs {where} tmpfs defaults,size={-(-need * 5 // 4 >> 30)}G 0 0)")
    if total is None:
        return unknown(f"cannot tell the size of the filesystem holding {arena.path} ({how})", **details)
    if need > total:
        return fail(f"the arena needs {fmt_bytes(need)} but {where} holds only {fmt_bytes(total)}: creating it fails "
                    "with no space left (or, on tmpfs, engines die with SIGBUS touching its pages)", fix, **details)
    if free is not None and need > free:
        return fail(f"the arena needs {fmt_bytes(need)}; {where} is {fmt_bytes(total)} but only {fmt_bytes(free)} is "
                    "free", f"remove stale files from {where} (`gpuwarden purge --arenas` removes arenas nobody "
                    f"maps), or {fix}", **details)
    room = f", {fmt_bytes(free)} free" if free is not None else ""
    return passed(f"the arena ({fmt_bytes(need)}) fits in {where} ({fmt_bytes(total)}{room})", **details)


# --- RLIMIT_MEMLOCK ------------------------------------------------------------------------------------------------
INFINITY = -1


def parse_limits_line(text: str) -> int | None:
    """/proc/<pid>/limits 'Max locked memory' soft limit in bytes, INFINITY for unlimited."""
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            soft = line[len("Max locked memory"):].split()[0]
            return INFINITY if soft == "unlimited" else int(soft)
    return None


def _groups(user: str) -> set[str]:
    try:
        gids = os.getgrouplist(user, pwd.getpwnam(user).pw_gid)
        return {grp.getgrgid(g).gr_name for g in gids}
    except (KeyError, OSError):
        return set()


def _limits_conf(io: CheckIO, user: str | None) -> list[str]:
    """memlock lines of limits.conf and limits.d/*.conf that apply to `user` (or its groups, or everyone)."""
    lines, groups = [], None
    files = ["security/limits.conf"] + [f"security/limits.d/{n}" for n in io.listdir("etc", "security/limits.d")
                                         if n.endswith(".conf")]
    for rel in files:
        for raw in (io.text("etc", rel) or "").splitlines():
            parts = raw.split("#", 1)[0].split()
            if len(parts) != 4 or parts[2] != "memlock":
                continue
            who = parts[0]
            if who.startswith("@") and user and groups is None:
                groups = _groups(user)  # only now: the group database may be a slow directory service
            if who == "*" or who == user or (who.startswith("@") and who[1:] in (groups or set())):
                lines.append(f"/etc/{rel}: {' '.join(parts)}")
    return lines


def _systemd_memlock(io: CheckIO) -> list[str]:
    out = []
    for rel in ["systemd/system.conf"] + [f"systemd/system/{n}" for n in io.listdir("etc", "systemd/system")
                                          if n.startswith("gpuwarden") and n.endswith(".service")]:
        for raw in (io.text("etc", rel) or "").splitlines():
            m = re.match(r"\s*(Default)?LimitMEMLOCK\s*=\s*(\S+)", raw)
            if m:
                out.append(f"/etc/{rel}: {raw.strip()}")
    return out


def _show(limit: int | None) -> str:
    return "unlimited" if limit == INFINITY else ("unknown" if limit is None else fmt_bytes(limit))


def check_memlock(io: CheckIO) -> Result:
    limits: dict[str, int] = {}
    for name in engine_state.names(io.settings.state_dir):
        record = engine_state.read_state(io.settings.state_dir, name) or {}
        pid = record.get("pid")
        if isinstance(pid, int):
            text = io.text("proc", f"{pid}/limits")
            value = parse_limits_line(text) if text else None
            if value is not None:
                limits[f"engine {name} (pid {pid})"] = value
    if is_live_proc(io):
        io.note("getrlimit(RLIMIT_MEMLOCK)")
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        limits["engines launched from this shell"] = INFINITY if soft == resource.RLIM_INFINITY else soft
        uid: int | None = os.getuid()
    else:
        recorded = io.probe.extra.get("memlock_soft")
        if recorded is not None:
            limits["the bundle's collector"] = INFINITY if recorded == "unlimited" else int(recorded)
        recorded_uid = io.probe.extra.get("uid")  # the bundle's node.json collected_by.uid
        uid = recorded_uid if isinstance(recorded_uid, int) else None
    try:
        user = pwd.getpwuid(uid).pw_name if uid is not None else None
    except KeyError:
        user = None
    conf = _limits_conf(io, user) + _systemd_memlock(io)
    if not limits:
        return unknown("no memlock limit to read: no engine running and not the live node", **{"config": conf})
    arena = None
    try:
        arena = _arena(io)
    except GpuwardenError:
        pass
    need = _arena_bytes(arena, is_live_proc(io)) if arena is not None else None
    low = {k: v for k, v in limits.items() if v != INFINITY and (need is None or v < need)}
    shown = "; ".join(f"{k}: {_show(v)}" for k, v in limits.items())
    details = {"limits": {k: _show(v) for k, v in limits.items()}, "arena_bytes": need, "config": conf}
    target = f"{user or '<engine user>'}"
    fix = (f"'{target} - memlock unlimited' in /etc/security/limits.d/90-gpuwarden.conf (new logins), or "
           "LimitMEMLOCK=infinity in the engines' systemd unit; for this shell: ulimit -l unlimited")
    why = ("mlock-based pinning (the canary's host runtime) needs at least the arena, and RDMA memory registration "
           "(NCCL/RCCL over InfiniBand or RoCE) fails below it")
    if need is None:
        if all(v == INFINITY for v in limits.values()):
            return passed(f"RLIMIT_MEMLOCK unlimited ({shown})", **details)
        return passed(f"RLIMIT_MEMLOCK {shown}; no arena configured to compare with ({why}; unlimited is the safe "
                      "setting)", **details)
    if low:
        return warn(f"RLIMIT_MEMLOCK below the arena ({fmt_bytes(need)}): {shown}; {why}", fix, **details)
    return passed(f"RLIMIT_MEMLOCK covers the arena ({fmt_bytes(need)}): {shown}", **details)


# --- KFD budget ----------------------------------------------------------------------------------------------------
def check_kfd_budget(io: CheckIO) -> Result:
    cfg = node_config(io)
    if cfg is None or cfg.arena is None:
        return skip("no [arena] in the node config")
    if not cfg.engines:
        return skip("the node config lists no engines")
    if not io.exists("gpu", "module/amdgpu") and not io.exists("gpu", "class/kfd"):
        return skip("no amdgpu/KFD: the KFD registration limit does not apply")
    io.note("/sys/module/amdgpu/parameters/no_system_mem_limit")
    io.note("/proc/meminfo")
    settings = io.settings.with_(sysfs_root=io.roots.gpu, proc_root=io.roots.proc)
    size, visible = kfd_budget.from_config(settings)
    b = kfd_budget.compute(settings, size, visible)
    details = b.to_dict()
    summary = " ".join(b.lines()[:3])
    if b.fits:
        return passed(f"fits: {summary}", **details)
    return fail(f"does not fit: {summary} — registrations past the limit fail or crash the runtime",
                "; ".join(b.advice) or None, **details)


# --- THP and swap --------------------------------------------------------------------------------------------------
def _active(text: str | None) -> str | None:
    m = re.search(r"\[([^\]]+)\]", text or "")
    return m[1] if m else (text.strip() if text else None)


def check_thp(io: CheckIO) -> Result:
    base = "kernel/mm/transparent_hugepage"
    enabled = _active(io.line("sys", f"{base}/enabled"))
    defrag = _active(io.line("sys", f"{base}/defrag"))
    shmem = _active(io.line("sys", f"{base}/shmem_enabled"))
    if enabled is None:
        return skip("no transparent huge pages in this kernel (no /sys/kernel/mm/transparent_hugepage)")
    details = {"enabled": enabled, "defrag": defrag, "shmem_enabled": shmem}
    shmem_note = (f"shmem_enabled={shmem}: a tmpfs arena gets huge pages only with always/within_size/advise "
                  "(or a tmpfs mounted huge=)" if shmem else "shmem_enabled unread")
    if enabled == "always" and defrag == "always":
        return warn(f"THP enabled=always with defrag=always: page faults may stall in direct compaction (latency "
                    f"spikes in the engines); {shmem_note}",
                    f"echo madvise > /sys/{base}/defrag  (transparent_hugepage=madvise on the kernel command line "
                    "to keep it)", **details)
    return passed(f"THP enabled={enabled}, defrag={defrag}; {shmem_note}", **details)


def check_swap(io: CheckIO) -> Result:
    text = io.text("proc", "swaps")
    mem = meminfo(io)
    devices = [line.split()[0] for line in (text or "").splitlines()[1:] if line.strip()]
    total = mem.get("SwapTotal")
    swappiness = io.int("proc", "sys/vm/swappiness")
    details = {"devices": devices, "swap_total": total, "swappiness": swappiness}
    if text is None and total is None:
        return unknown("cannot read /proc/swaps or /proc/meminfo")
    if not devices and not total:
        return passed("no swap: engine memory outside the pinned arena is never paged out", **details)
    used = (total or 0) - mem.get("SwapFree", 0)
    return warn(f"swap is on ({', '.join(devices) or fmt_bytes(total)}, {fmt_bytes(used)} used, swappiness "
                f"{swappiness}): under memory pressure engine memory outside the pinned arena is paged out and "
                "serving stalls; kubelet also refuses to start on swap unless configured for it",
                "swapoff -a, and remove the swap lines from /etc/fstab", **details)
