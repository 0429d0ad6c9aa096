"""Per-process load, refresh after refresh: host CPU %, RSS, threads and CPU time from /proc/<pid>/stat, and GPU
time from DRM fdinfo engine counters (AMD) or NVML's process utilisation (NVIDIA), over the interval between reads.

What one refresh costs: one pread of a held stat file per GPU process, and one pread of a held fdinfo file per DRM
client (not per descriptor: a client shown by several fds or processes is read through one of them), all the fdinfo
reads in one job under the read deadline (amdgpu_show_fdinfo takes the VM's reservation lock, which a hung GPU
can hold). The answer is a table of its own (pid -> ProcessLoad); the process records are left as they are.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuwarden.ops.node.backends import fdinfo
from gpuwarden.ops.foundation.deadline import DEFAULT_S, LANES, LateRead, Lanes
from gpuwarden.ops.foundation.heldfiles import HeldFiles
from gpuwarden.ops.foundation.model import GpuInfo, GpuLoad, GpuProcess, ProcessLoad

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Callable

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
# The engines whose time is the GPU% column: what shaders run (graphics and compute queues of the DRM scheduler).
MAIN_ENGINES = ("gfx", "compute")
_NOT_DRM = ""  # an fd whose fdinfo has no DRM stats: not read again while it names the same file
_GONE = ("gone", "zombie", "dead")
_NO_GPUS: dict[int, GpuLoad] = {}  # shared by every process without GPU figures (never changed)

# (pid, fd, render node it points at): one descriptor of a DRM client
Member = tuple[int, int, str]


class _Host:
    """The last stat reading of one process: its bytes, when, and what was made of them."""

    __slots__ = ("raw", "at", "ticks", "start", "fields")

    def __init__(self, raw: bytes, at: float, ticks: int, start: bytes, fields: tuple[float | None, float, int, int]):
        self.raw, self.at, self.ticks, self.start, self.fields = raw, at, ticks, start, fields


class ProcLoadReader:
    """Keeps what the deltas need (last stat and engine counters, which fd shows which client). One per sampler."""

    def __init__(self, proc_root: Path = Path("/proc"), fdinfo_root: Path | None = None, *,
                 deadline_s: float = DEFAULT_S, lanes: Lanes = LANES, clock: Callable[[], float] = time.monotonic,
                 per_refresh: int = 32, before_read: Callable[[], None] | None = None):
        self._proc = str(proc_root)
        self._fdinfo = str(fdinfo_root if fdinfo_root is not None else proc_root)
        self.deadline_s = deadline_s
        self._lanes = lanes
        self._clock = clock  # monotonic seconds (tests move their own)
        self._before_read = before_read  # the sim driver writes its fdinfo files here, as a kernel does at read
        self._stat = HeldFiles()
        self._fdinfo_files = HeldFiles(blocking_open=True)  # read in the fdinfo lane only
        self._host: dict[int, _Host] = {}
        self._fd_client: dict[Member, str] = {}  # which client key each descriptor showed when last read
        self._parsed: dict[str, tuple[bytes, fdinfo.DrmClient | None]] = {}  # path -> last bytes and their parse
        # client key -> (monotonic time of its last read, engine ns as held: never below an earlier value)
        self._engines: dict[str, tuple[float, dict[str, int]]] = {}
        self._gpu_last: dict[int, dict[int, GpuLoad]] = {}  # pid -> its GPU loads of the last complete read
        self._loads: dict[int, ProcessLoad] = {}
        self.late: LateRead | None = None  # the fdinfo read of the last refresh, when it did not answer in time
        self.reads = 0  # fdinfo files read by the last refresh (at most one per DRM client, once fds are known)
        # At most this many stat files and DRM clients are read a refresh (beyond it, in turns): a node of 2,000
        # GPU processes costs the same refresh as one of 32, each figure then over its own longer interval (an
        # LLM node's few dozen engines are all read every refresh).
        self.per_refresh = per_refresh
        self._turn = 0
        self._drm_turn = 0
        self._members_of: object = None  # the drm_fds the members below were made from
        self._members: list[Member] = []
        self._age: dict[int, int] = {}
        self._by_key: dict[str, list[Member]] = {}
        self._keys: list[str] = []
        self._owner: dict[str, Member] = {}
        self._state: dict[str, tuple[fdinfo.DrmClient, dict[str, float] | None, int | None]] = {}
        self._regroup = False
        self._owned: dict[int, list[str]] = {}  # pid -> the clients it owns
        self._gpu_dirty: set[int] | None = None  # pids whose GPU figures the last _drm changed (None: all may have)
        self._processes: object = None  # the processes tuple of the last refresh
        self._source: str | None = None

    def close(self) -> None:
        self._stat.close()
        self._fdinfo_files.close()

    # ------------------------------------------------------------------------------------------------------------
    def sample(self, processes: tuple[GpuProcess, ...], gpus: tuple[GpuInfo, ...],
               drm_fds: dict[tuple[int, int], dict[int, str]] | None = None,
               nvml: dict[int, dict[int, tuple[int, int, int, int]]] | None = None) -> dict[int, ProcessLoad]:
        """The load of each live process now. `drm_fds`: (pid, start ticks) -> {fd: render node} of the DRM
        holders, a new mapping whenever they change (the deep scan's); `nvml`: gpu -> pid -> (sm, mem, enc, dec) %
        of the GPUs NVML answered for."""
        now = self._clock()
        gpu_loads: dict[int, dict[int, GpuLoad]] = {}
        source = None
        if drm_fds:
            source = "fdinfo"
            gpu_loads = self._drm(drm_fds, gpus)
        elif nvml is not None:
            source = "nvml"
            gpu_loads = _from_nvml(processes, nvml)
        out: dict[int, ProcessLoad] = {}
        host = self._host
        seen: set[int] = set()
        read = self._stat.read
        root = self._proc
        prev_loads = self._loads
        n, budget = len(processes), self.per_refresh
        turn = self._turn % n if n > budget else 0  # past the budget, a window that moves on each refresh
        self._turn = turn + budget
        todo: "Any" = enumerate(processes)
        dirty = self._gpu_dirty if source == "fdinfo" else set() if source is None else None
        if n > budget and processes is self._processes and dirty is not None and source == self._source:
            # The same processes as the last refresh: only the window's and those whose GPU figures changed are
            # looked at, the others' records stand as they are (a loop over 2,000 would cost more than the reads).
            out = dict(prev_loads)
            seen = set(out)
            window = [(i % n, processes[i % n]) for i in range(turn, turn + budget)]
            in_window = {p.pid for _, p in window}
            for pid in dirty - in_window:
                prev = out.get(pid)
                if prev is not None:
                    out[pid] = ProcessLoad(pid=pid, cpu_percent=prev.cpu_percent, cpu_time_s=prev.cpu_time_s,
                                           rss_bytes=prev.rss_bytes, threads=prev.threads,
                                           gpus=gpu_loads.get(pid) or _NO_GPUS, source=source)
            todo = window
        self._processes = processes
        self._source = source
        for index, p in todo:
            pid = p.pid
            if p.state in _GONE:
                continue
            last = host.get(pid)
            if last is not None and n > budget and (index - turn) % n >= budget:
                # Not its turn: its last reading stands (its CPU% is over its own, longer interval).
                seen.add(pid)
                gl = gpu_loads.get(pid) or _NO_GPUS
                prev = prev_loads.get(pid)
                out[pid] = prev if prev is not None and prev.gpus is gl else ProcessLoad(
                    pid=pid, cpu_percent=last.fields[0], cpu_time_s=last.fields[1], rss_bytes=last.fields[2],
                    threads=last.fields[3], gpus=gl, source=source)
                continue
            path = f"{root}/{pid}/stat"
            raw = read(path, 1024)
            if not raw:
                continue
            fields = None
            if last is not None and raw == last.raw:
                if last.fields[0] != 0.0:
                    last.fields = (0.0,) + last.fields[1:]  # not one tick of CPU time since the last read
                fields = last.fields
                last.at = now
            else:
                rpar = raw.rfind(b")")
                rest = raw[rpar + 2:].split()
                if rpar < 0 or len(rest) < 22:
                    continue
                ticks = int(rest[11]) + int(rest[12])  # utime + stime
                start = rest[19]
                if last is not None and last.start != start:
                    last = None  # the PID names another process now: no delta across the two
                    self._stat.drop(path)
                percent = None
                if last is not None and now > last.at:
                    percent = round(100.0 * (ticks - last.ticks) / _CLK_TCK / (now - last.at), 1)
                fields = (max(percent, 0.0) if percent is not None else None, round(ticks / _CLK_TCK, 2),
                          int(rest[21]) * _PAGE, int(rest[17]))
                if last is None:
                    host[pid] = _Host(raw, now, ticks, start, fields)
                else:
                    last.raw, last.at, last.ticks, last.fields = raw, now, ticks, fields
            seen.add(pid)
            gl = gpu_loads.get(pid) or _NO_GPUS
            prev = prev_loads.get(pid)
            if prev is not None and prev.source == source and (prev.gpus is gl or prev.gpus == gl) and \
                    (prev.cpu_percent, prev.cpu_time_s, prev.rss_bytes, prev.threads) == fields:
                out[pid] = prev  # the same object: its JSON is made once
                continue
            out[pid] = ProcessLoad(pid=pid, cpu_percent=fields[0], cpu_time_s=fields[1], rss_bytes=fields[2],
                                   threads=fields[3], gpus=gl, source=source)
        if len(host) > len(seen):
            for pid in host.keys() - seen:
                del host[pid]
                self._stat.drop(f"{root}/{pid}/stat")
        self._loads = out
        return out

    # ------------------------------------------------------------------------------------------------------------
    def _drm(self, drm_fds: dict[tuple[int, int], dict[int, str]], gpus: tuple[GpuInfo, ...]
             ) -> dict[int, dict[int, GpuLoad]]:
        """Each process's GPU loads from its DRM clients' fdinfo; the last complete answer when the read is late.
        Only the processes whose clients were read this refresh are worked out again."""
        if drm_fds is not self._members_of:  # a deep scan found the holders again
            self._members = [(pid, fd, target) for (pid, _), fds in drm_fds.items() for fd, target in fds.items()]
            self._age = {pid: ticks for pid, ticks in drm_fds}
            self._members_of = drm_fds
            self._regroup = True
        try:
            read = self._lanes.run(("fdinfo", self._fdinfo), self._read_clients, self.deadline_s, source="fdinfo")
        except LateRead as late:
            self.late = late
            self._gpu_dirty = set()
            return self._gpu_last
        self.late = None
        by_render = {f: g.index for g in gpus for f in g.device_files}
        by_pdev: dict[str | None, int | None] = {}
        for g in gpus:
            # Partitions of one device share its PCI address: the address alone cannot say which one.
            by_pdev[g.bus_id] = g.index if g.bus_id not in by_pdev else None
        engines_prev = self._engines
        dirty: set[int] = set()
        for key, (client, at) in read.items():
            owner = self._owner.get(key)
            if owner is None:
                continue
            gpu = by_render.get(owner[2])
            if gpu is None:
                gpu = by_pdev.get(client.pdev)
            before = engines_prev.get(key)
            held = dict(client.engine_ns)
            if before is not None:
                for name, ns in before[1].items():  # a counter seen going back stays at its larger value
                    if held.get(name, 0) < ns:
                        held[name] = ns
            engines_prev[key] = (at, held)
            percents: dict[str, float] | None = None
            if client.percent:
                percents = dict(client.percent)  # pre-5.19: the kernel's own percent
            elif before is not None and at > before[0]:
                wall_ns = (at - before[0]) * 1e9
                percents = {name: min(100.0, max(0.0, 100.0 * (ns - before[1].get(name, 0)) / wall_ns
                                                 / client.capacity.get(name, 1)))
                            for name, ns in held.items()}
            last = self._state.get(key)
            if last is not None and last[0] is client and last[2] == gpu and (last[1] == percents or (
                    percents is not None and last[1] is not None and not any(percents.values())
                    and not any(last[1].values()))):
                continue  # the same bytes again and idle before and now: its owner's figures stand
            self._state[key] = (client, percents, gpu)
            dirty.add(owner[0])
        regrouped = self._regroup
        if self._regroup:
            self._regroup = False
            for gone in engines_prev.keys() - self._by_key.keys():
                del engines_prev[gone]
                self._state.pop(gone, None)
            self._gpu_last = {}
            dirty = {m[0] for m in self._owner.values()}
        loads = self._gpu_last
        owned = self._owned
        for pid in dirty:
            loads[pid] = self._aggregate(pid, owned.get(pid, ()))
        self._gpu_dirty = None if regrouped else dirty
        return loads

    def _aggregate(self, pid: int, keys: "list[str] | tuple[()]") -> dict[int, GpuLoad]:
        """One process's GpuLoads over the clients it owns."""
        slots: dict[int, dict[str, Any]] = {}
        for key in keys:
            state = self._state.get(key)
            if state is None:
                continue
            client, percents, gpu = state
            if gpu is None:
                continue
            slot = slots.setdefault(gpu, {"percent": None, "engines": {}, "engine_ns": {}, "clients": 0,
                                          "vram": None, "shared": set()})
            slot["clients"] += 1
            if client.vram_bytes is not None:
                slot["vram"] = (slot["vram"] or 0) + client.vram_bytes
            for name, ns in self._engines.get(key, (0.0, client.engine_ns))[1].items():
                slot["engine_ns"][name] = slot["engine_ns"].get(name, 0) + ns
            if percents is not None:
                for name, value in percents.items():
                    slot["engines"][name] = min(100.0, slot["engines"].get(name, 0.0) + value)
                main = sum(percents.get(name, 0.0) for name in MAIN_ENGINES)
                slot["percent"] = min(100.0, (slot["percent"] or 0.0) + main)
            slot["shared"].update(m[0] for m in self._by_key.get(key, ()) if m[0] != pid)
        return {gpu: GpuLoad(percent=_r(s["percent"]), engines={k: round(v, 1) for k, v in s["engines"].items()},
                             engine_ns=s["engine_ns"], clients=s["clients"], vram_bytes=s["vram"],
                             shared_with=tuple(sorted(s["shared"])))
                for gpu, s in slots.items()}

    def _read_clients(self, mark: Callable[..., None]) -> dict[str, tuple[fdinfo.DrmClient, float]]:
        """(lane job) key -> (its DrmClient, when read) for the clients read this refresh. A descriptor not seen
        before is read once to learn its client; then each client is read through one of its descriptors, up to
        per_refresh clients a refresh, in turns."""
        fd_client = self._fd_client
        sampled: dict[str, tuple[fdinfo.DrmClient, float]] = {}
        self.reads = 0
        mark("the DRM fdinfo files", self._fdinfo)
        if self._before_read is not None:
            self._before_read()
        if self._regroup:
            wanted = set(self._members)
            for m in [m for m in fd_client if m not in wanted]:
                del fd_client[m]
                path = f"{self._fdinfo}/{m[0]}/fdinfo/{m[1]}"
                self._fdinfo_files.drop(path)
                self._parsed.pop(path, None)
            for m in self._members:
                if fd_client.get(m) in (None, _NOT_DRM):  # new, or without DRM stats when last read: learn it
                    client, at = self._read_one(m, mark)
                    key = fd_client[m] = _key(client) if client is not None else _NOT_DRM
                    if client is not None and key not in sampled:
                        sampled[key] = (client, at)
            self._group()
        keys = self._keys
        n, budget = len(keys), self.per_refresh
        turn = self._drm_turn % n if n > budget else 0
        self._drm_turn = turn + budget
        batch = keys if n <= budget else keys[turn:turn + budget] + keys[:max(0, turn + budget - n)]
        for key in batch:
            if key in sampled:
                continue
            for m in list(self._by_key.get(key, ())):
                client, at = self._read_one(m, mark)
                now_key = _key(client) if client is not None else _NOT_DRM
                if now_key == key and client is not None:
                    sampled[key] = (client, at)
                    break
                # The fd number names another file now (closed and opened again): it shows another client.
                fd_client[m] = now_key
                self._regroup = True
                if client is not None and now_key not in sampled:
                    sampled[now_key] = (client, at)
        if self._regroup:
            self._group()
        return sampled

    def _group(self) -> None:
        """Clients -> the descriptors that show them, and who owns each: the oldest holder (a fork or a passed fd
        came later), where its time is counted, once."""
        by_key: dict[str, list[Member]] = {}
        for m in self._members:
            key = self._fd_client.get(m)
            if key:
                by_key.setdefault(key, []).append(m)
        age = self._age
        self._by_key = by_key
        self._keys = list(by_key)
        self._owner = {key: min(ms, key=lambda m: (age.get(m[0], 0), m[0])) for key, ms in by_key.items()}
        owned: dict[int, list[str]] = {}
        for key, m in self._owner.items():
            owned.setdefault(m[0], []).append(key)
        self._owned = owned
        self._regroup = True  # _drm works every owner out again

    def _read_one(self, m: Member, mark: Callable[..., None]) -> tuple[fdinfo.DrmClient | None, float]:
        path = f"{self._fdinfo}/{m[0]}/fdinfo/{m[1]}"
        mark(f"{m[0]}/fdinfo/{m[1]}", path)
        self.reads += 1
        raw = self._fdinfo_files.read(path, 8192)
        at = self._clock()
        if not raw:
            return None, at
        last = self._parsed.get(path)
        if last is not None and last[0] == raw:
            return last[1], at
        client: fdinfo.DrmClient | None = None
        if last is not None and last[1] is not None:
            # A busy client's file differs from the last only in its drm-engine-* lines (amdgpu prints them last):
            # the same bytes before them are the same client, so only those lines are read again.
            cut = raw.find(b"drm-engine-")
            if cut > 0 and last[0][:cut] == raw[:cut] and last[0][cut:cut + 11] == b"drm-engine-":
                engines = fdinfo.engine_times(raw[cut:])
                if engines is not None:
                    client = fdinfo.with_engines(last[1], engines)
        if client is None:
            client = fdinfo.parse(raw.decode(errors="replace"))
        self._parsed[path] = (raw, client)
        return client, at


def _key(client: fdinfo.DrmClient) -> str:
    # drm-client-id may be unique per device only (drm-usage-stats.rst): the device's address is part of the key.
    return f"{client.pdev}|{client.client_key}"


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _from_nvml(processes: tuple[GpuProcess, ...], nvml: dict[int, dict[int, tuple[int, int, int, int]]]
               ) -> dict[int, dict[int, GpuLoad]]:
    """NVML's per-process samples as GpuLoads; a process on a GPU NVML answered for, without a sample there, ran
    nothing in the interval (0%)."""
    out: dict[int, dict[int, GpuLoad]] = {}
    for p in processes:
        for gpu in p.vram:
            samples = nvml.get(gpu)
            if samples is None:
                continue
            sm, mem, enc, dec = samples.get(p.pid, (0, 0, 0, 0))
            out.setdefault(p.pid, {})[gpu] = GpuLoad(percent=float(sm), engines={
                "sm": float(sm), "mem": float(mem), "enc": float(enc), "dec": float(dec)})
    return out
