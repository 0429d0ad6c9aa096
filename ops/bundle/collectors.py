"""The bundle's collectors: what each gathers and from where. Each returns a list of Entry.

Vendor tools (amd-smi, rocm-smi, nvidia-smi) are the ones that hang on a wedged GPU: --safe-mode
skips them. Everything else reads files or runs in-process code under the same per-collector deadline.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuwarden.ops import __version__
from gpuwarden.ops.foundation import redact, statedir
from gpuwarden.ops.agent import client
from gpuwarden.ops.sampling import take_snapshot
from gpuwarden.ops.bundle import doctor_inputs
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.arena.watch import list_arenas
from gpuwarden.ops.engines import state as engine_state
from gpuwarden.ops.foundation.model import plain
from gpuwarden.ops.bundle import kernellog, trees
from gpuwarden.ops.bundle.entries import FAILED, Entry, from_command
from gpuwarden.ops.bundle.runner import run_command
from gpuwarden.ops.bundle.cores import backtrace_entries

VENDOR_COMMANDS: tuple[tuple[str, list[str], str], ...] = (
    ("amd-smi-static", ["amd-smi", "static", "--json"], "vendor/amd-smi-static.json"),
    ("amd-smi-metric", ["amd-smi", "metric", "--json"], "vendor/amd-smi-metric.json"),
    ("amd-smi-process", ["amd-smi", "process", "--json"], "vendor/amd-smi-process.json"),
    ("rocm-smi-allinfo", ["rocm-smi", "--showallinfo", "--json"], "vendor/rocm-smi-showallinfo.json"),
    ("rocm-smi-pids", ["rocm-smi", "--showpids"], "vendor/rocm-smi-showpids.txt"),
    ("nvidia-smi", ["nvidia-smi", "-q", "-x"], "vendor/nvidia-smi-q.xml"),
)
LOG_TAIL = 256 << 10  # of each engine log and the journal
GPU_LIBS = re.compile(
    r"(/\S*lib(?:amdhip64|hsa-runtime64|hsakmt|amd_comgr|rocblas|hipblaslt|rccl|MIOpen|amd_smi|rocm_smi64"
    r"|cuda|cudart|nvidia-ml|nccl|cublas|cublasLt|cudnn)\.so[^\s/]*)$")


@dataclass
class Context:
    settings: Settings
    since_s: float | None
    timeout_s: float
    safe_mode: bool
    sysfs_root: Path  # the tree the backend really reads (the sim node's, on a sim node)
    dev_roots: list[Path]
    deadline: float = 0.0  # monotonic; set per collector by the orchestrator
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Collector:
    name: str
    fn: Callable[[Context], list[Entry]]
    vendor: bool = False


def _vendor(name: str, argv: list[str], path: str) -> Callable[[Context], list[Entry]]:
    def run(ctx: Context) -> list[Entry]:
        res = run_command(argv, max(0.1, ctx.deadline - time.monotonic()))
        return from_command(name, res, path)
    return run


def _snapshot(ctx: Context) -> list[Entry]:
    t0 = time.monotonic()
    snap = take_snapshot(ctx.settings)
    out = [Entry("snapshot", "gpuwarden.ops.sampling.take_snapshot", "python", path="gpuwarden/snapshot.json",
                 data=snap.to_json().encode(), duration_s=time.monotonic() - t0)]
    # The agent's last sample, when one runs: on Kubernetes it names each process's namespace, pod and container,
    # and which pod had which GPU, evidence a bare sample here cannot give.
    reply = client.snapshot(ctx.settings.state_dir, timeout=min(2.0, max(0.1, ctx.deadline - time.monotonic())))
    if reply is not None:
        out.append(Entry("snapshot", "agent socket GET /v1/snapshot", "python", path="gpuwarden/agent-snapshot.json",
                         data=reply.body))
    return out


def _sysfs(ctx: Context) -> list[Entry]:
    return trees.copy_sysfs(ctx.sysfs_root)


def engine_pids(settings: Settings) -> set[int]:
    pids: set[int] = set()
    for name in engine_state.names(settings.state_dir):
        try:
            record = engine_state.read_state(settings.state_dir, name) or {}
        except Exception:
            continue  # a corrupt record is copied as a file by the engines collector
        for key in ("pid", "shim_pid"):
            if isinstance(record.get(key), int):
                pids.add(record[key])
    return pids


def _proc(ctx: Context) -> list[Entry]:
    globs = trees.gpu_device_globs(ctx.dev_roots)
    holders, denied = trees.find_holders(ctx.settings.proc_root, globs)
    pids = holders | engine_pids(ctx.settings) | trees.kfd_pids(ctx.sysfs_root)
    entries = trees.copy_proc(ctx.settings.proc_root, pids, globs)
    if denied:
        entries.append(Entry("proc", f"{ctx.settings.proc_root}/*/fd", "file", status="permission-denied",
                             error=f"could not check {denied} processes' open files for GPU device files "
                                   "(run as root to see every GPU holder)"))
    entries.append(_versions(ctx, entries))
    summary = {"gpu_holders": sorted(holders), "engine_pids": sorted(engine_pids(ctx.settings)),
               "kfd_pids": sorted(trees.kfd_pids(ctx.sysfs_root)), "fd_dirs_not_readable": denied,
               "device_globs": globs}
    entries.append(Entry("proc", "process discovery", "generated", path="gpuwarden/pids.json",
                         data=json.dumps(summary, indent=2).encode()))
    return entries


def _versions(ctx: Context, proc_entries: list[Entry]) -> Entry:
    libs: dict[str, list[str]] = {}
    for e in proc_entries:
        if e.path and e.path.endswith("/maps") and e.data:
            pid = e.path.split("/")[-2]
            found = sorted({m.group(1) for line in e.data.decode(errors="replace").splitlines()
                            if (m := GPU_LIBS.search(line))})
            if found:
                libs[pid] = found
    u = os.uname()
    versions = {
        "gpuwarden": __version__, "python": sys.version.split()[0],
        "kernel": {"sysname": u.sysname, "release": u.release, "version": u.version, "machine": u.machine},
        "platform": platform.platform(),
        "amdgpu_module": _first_line(ctx.sysfs_root / "module/amdgpu/version"),
        "nvidia_module": _first_line(ctx.sysfs_root / "module/nvidia/version")
        or _first_line(ctx.settings.proc_root / "driver/nvidia/version"),
        "gpu_libraries_by_pid": libs,
    }
    return Entry("proc", "uname, module versions, GPU libraries in /proc/<pid>/maps", "generated",
                 path="node/versions.json", data=json.dumps(versions, indent=2).encode())


def _first_line(path: Path) -> str | None:
    data, _, _ = trees.read_file(path, 4096)
    return data.decode(errors="replace").strip().splitlines()[0] if data and data.strip() else None


def _node(ctx: Context) -> list[Entry]:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def show(v: int) -> str | int:
        return "unlimited" if v == resource.RLIM_INFINITY else v
    info = {
        "collected_by": {"uid": os.getuid(), "euid": os.geteuid(), "pid": os.getpid()},
        "memlock_limit_of_collector": {"soft": show(soft), "hard": show(hard)},
        "hostname": os.uname().nodename,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    entries = [Entry("node", "getrlimit(RLIMIT_MEMLOCK), uname", "generated", path="node/node.json",
                     data=json.dumps(info, indent=2).encode())]
    for conf in (Path("/etc/security/limits.conf"),):
        data, status, error = trees.read_file(conf)
        if data is not None:
            entries.append(Entry("node", str(conf), "file", path=f"node/{conf.name}", data=data))
        elif status:
            entries.append(Entry("node", str(conf), "file", status=status, error=error))
    return entries


def _tail(d: statedir.Dir, name: str, limit: int = LOG_TAIL) -> tuple[bytes | None, str | None]:
    """The end of a state-dir file, opened through its checked directory (no symlink, no FIFO)."""
    try:
        fd = d.open(name)
    except FileNotFoundError:
        return None, None
    except GpuwardenError as exc:
        return None, exc.message
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, limit, max(0, size - limit)), None
    except OSError as exc:
        return None, exc.strerror
    finally:
        os.close(fd)


def _spec(data: bytes) -> bytes:
    """An engine's spec.json as evidence: argv option by option and env by name redacted (as a JSON list,
    `"--password", "x"` is two strings that the text patterns cannot pair)."""
    try:
        spec = json.loads(data)
        engine = spec["engine"]
        engine["argv"] = redact.redact_argv(engine.get("argv") or [])[0]
        engine["env"] = redact.env_mapping(engine.get("env") or {})
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return data  # not the shape gpuwarden writes: the text patterns still run over it
    return json.dumps(spec, indent=2, sort_keys=True).encode()


def _engines(ctx: Context) -> list[Entry]:
    entries: list[Entry] = []
    try:
        root = statedir.open_dir(ctx.settings.state_dir, statedir.ENGINES)
    except (OSError, GpuwardenError):
        return entries
    with root:
        for name in sorted(root.listdir()):
            try:
                d = root.subdir(name)
            except GpuwardenError as exc:
                entries.append(Entry("engines", str(root.path / name), "file", status=FAILED, error=exc.message))
                continue
            with d:
                for f in sorted(d.listdir()):
                    if f.startswith("."):
                        continue
                    data, error = _tail(d, f)
                    if data is not None:
                        data = _spec(data) if f == "spec.json" else data
                        entries.append(Entry("engines", str(d.path / f), "file", path=f"engines/{name}/{f}", data=data))
                    elif error:
                        entries.append(Entry("engines", str(d.path / f), "file", status=FAILED, error=error))
            entries += _crash_backtrace(ctx, name)
    return entries


def _crash_backtrace(ctx: Context, name: str) -> list[Entry]:
    """The core dump's backtrace of an engine that died of a signal (what it died of, frame by frame)."""
    try:
        record = engine_state.read_state(ctx.settings.state_dir, name) or {}
        spec = engine_state.read_spec(ctx.settings.state_dir, name) or {}
    except Exception:
        return []  # an unreadable record is copied as a file above; nothing to look up
    if not record.get("signal"):
        return []
    return backtrace_entries(name, spec, record, ctx.settings.proc_root, ctx.deadline)


def _arena(ctx: Context) -> list[Entry]:
    arenas = list_arenas(ctx.settings)
    return [Entry("arena", "gpuwarden.ops.arena.watch.list_arenas", "python", path="gpuwarden/arenas.json",
                  data=json.dumps([plain(a) for a in arenas], indent=2).encode()),
            Entry("arena", "debugfs kfd/mem_limit (or the limit computed from RAM)", "generated",
                  path=KFD_LIMIT_MEMBER, data=json.dumps(_kfd_limit(ctx.settings), indent=2).encode())]


KFD_LIMIT_MEMBER = "gpuwarden/kfd_limit.json"


def _kfd_limit(settings: Settings) -> dict[str, object]:
    """KFD's system-memory use and limit for triage's context: debugfs when readable (root), else the limit the
    driver computes from RAM (amdgpu_amdkfd_gpuvm_init_mem_limits) with no figure for what is in use."""
    # deferred: keeps `gpuwarden bundle --help` cheap (17.6 ms there); most bundles never need the arithmetic
    from gpuwarden.ops.arena import budget
    live, where = budget.live_limit(settings)
    if live is not None:
        return {"used": live.system_used, "limit": live.system_limit, "source": "debugfs", "where": where}
    try:
        limit: int | None = budget.kfd_system_limit(budget.mem_total(settings.proc_root))
    except GpuwardenError:
        limit = None
    return {"used": None, "limit": limit, "source": "computed", "where": where,
            "no_system_mem_limit": budget.no_system_mem_limit(settings.sysfs_root)}


def _coredumps(ctx: Context) -> list[Entry]:
    res = run_command(["coredumpctl", "list", "--no-pager", "-q"], max(0.1, ctx.deadline - time.monotonic()))
    entries = from_command("coredumps", res, "node/coredumpctl-list.txt")
    d = Path("/var/lib/systemd/coredump")
    try:
        names = sorted(os.listdir(d))
        lines = []
        for n in names:
            try:
                st = os.stat(d / n)
                lines.append(f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(st.st_mtime))} {st.st_size} {n}")
            except OSError:
                lines.append(f"? ? {n}")
        entries.append(Entry("coredumps", str(d), "file", path="node/coredump-dir.txt",
                             data=("\n".join(lines) + "\n").encode()))
    except FileNotFoundError:
        pass
    except PermissionError as exc:
        entries.append(Entry("coredumps", str(d), "file", status="permission-denied", error=exc.strerror))
    return entries


def _journal(ctx: Context) -> list[Entry]:
    """The journal's tail, and the node state a replay needs (idle baseline, drained GPUs)."""
    entries: list[Entry] = []
    try:
        d = statedir.open_dir(ctx.settings.state_dir)
    except FileNotFoundError:
        return entries
    with d:
        for name, dest in ((statedir.JOURNAL, "gpuwarden/journal.log"),
                           (statedir.BASELINE, "gpuwarden/state/baseline.json"),
                           (statedir.DRAINED, "gpuwarden/state/drained.json")):
            data, error = _tail(d, name)
            if data is not None:
                entries.append(Entry("journal", str(d.path / name), "file", path=dest, data=data))
            elif error:
                entries.append(Entry("journal", str(d.path / name), "file", status=FAILED, error=error))
    return entries


def _doctor_inputs(ctx: Context) -> list[Entry]:
    """What `gpuwarden doctor --bundle` reads beyond the trees above (kernel config, limits, firmware, THP, ...)."""
    s = ctx.settings
    roots = {"sys": s.sysfs_root, "gpu": ctx.sysfs_root, "proc": s.proc_root, "etc": s.etc_root,
             "boot": s.boot_root, "opt": s.opt_root}
    return doctor_inputs.collect(roots, s.config_path)


def _kernel(ctx: Context) -> list[Entry]:
    return kernellog.collect(ctx.settings, ctx.since_s, ctx.deadline)


COLLECTORS: tuple[Collector, ...] = (
    Collector("kernel-log", _kernel),
    *(Collector(name, _vendor(name, argv, path), vendor=True) for name, argv, path in VENDOR_COMMANDS),
    Collector("snapshot", _snapshot),
    Collector("sysfs", _sysfs),
    Collector("proc", _proc),
    Collector("node", _node),
    Collector("engines", _engines),
    Collector("arena", _arena),
    Collector("coredumps", _coredumps),
    Collector("journal", _journal),
    Collector("doctor-inputs", _doctor_inputs),
)
