"""Pod attribution of a snapshot: each GPU process and holder gets namespace, pod and container name.

The pod comes from /proc/<pid>/cgroup, read once per process identity (pid + start time) and cached, so a
refresh costs a dictionary look-up per process; names come from the pod cache (the API watch).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Protocol, TypedDict

from gpuwarden.ops.foundation.model import GpuProcess, Holder, NodeSnapshot, PodGpus, Residual
from gpuwarden.ops.k8s.cgroup import PodCgroup, parse
from gpuwarden.ops.k8s.pods import PodInfo

FORGET_GONE_S = 3600.0


class PodLookup(Protocol):
    version: int

    def get(self, uid: str) -> PodInfo | None: ...


class _PodFields(TypedDict, total=False):
    """The pod fields a GpuProcess or Holder gets (dataclasses.replace keywords)."""

    pod_uid: str
    namespace: str
    pod: str
    container_name: str | None


class _HolderFields(_PodFields, total=False):
    pod_deleted_at: float


class _NoPods:
    version = 0

    def get(self, uid: str) -> PodInfo | None:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(65536).decode(errors="replace")
    except OSError:
        return None


class PodAttributor:
    """Owns the cgroup cache; annotate() is called once per sample by the agent."""

    def __init__(self, proc_root: Path = Path("/proc"), pods: PodLookup | None = None,
                 clock: Callable[[], float] = time.time):
        self.proc_root = str(proc_root)
        self.pods = pods or _NoPods()
        self.clock = clock
        self._cgroups: dict[tuple[int, float | None], PodCgroup | None] = {}
        # pid -> (pod cgroup, last seen): a process gone from /proc whose PID the driver still charges
        self._last: dict[int, tuple[PodCgroup, float]] = {}
        # pid -> (input process, pod cache version, output): unchanged processes cost one comparison
        self._done: dict[int, tuple[GpuProcess, int, GpuProcess]] = {}
        self.reads = 0  # cgroup files read (cache misses), for the benchmark and tests

    def cgroup(self, pid: int, start_time: float | None) -> PodCgroup | None:
        key = (pid, start_time)
        try:
            return self._cgroups[key]
        except KeyError:
            pass
        found = None
        if start_time is not None:
            self.reads += 1
            text = _read(f"{self.proc_root}/{pid}/cgroup")
            found = parse(text) if text else None
        elif pid in self._last:
            found = self._last[pid][0]  # gone: the pod it ran in when last seen
        if found is None and start_time is not None and pid in self._last:
            # A v1 zombie shows "/" everywhere: keep the pod it was seen in while alive.
            found = self._last[pid][0]
        self._cgroups[key] = found
        return found

    def annotate(self, snap: NodeSnapshot, pod_gpus: tuple[PodGpus, ...] = ()) -> NodeSnapshot:
        now = self.clock()
        version = self.pods.version
        done = self._done
        fresh: dict[int, tuple[GpuProcess, int, GpuProcess]] = {}
        procs = []
        changed = False
        for p in snap.processes:
            prev = done.get(p.pid)
            if prev is not None and prev[0] is p and prev[1] == version:
                out = prev[2]
            else:
                out = self._annotated(p, now)
            fresh[p.pid] = (p, version, out)
            procs.append(out)
            changed = changed or out is not p
        self._done = fresh
        self._forget(fresh, now)
        residual = tuple(self._residual(r) for r in snap.residual)
        if not changed and all(a is b for a, b in zip(residual, snap.residual)) and not pod_gpus:
            return snap
        return dataclasses.replace(snap, processes=tuple(procs) if changed else snap.processes,
                                   residual=residual, pods=pod_gpus)

    def _annotated(self, p: GpuProcess, now: float) -> GpuProcess:
        cg = self.cgroup(p.pid, p.start_time)
        if cg is None:
            return p
        self._last[p.pid] = (cg, now)
        fields: _PodFields = {}
        self._fill(fields, cg)
        return dataclasses.replace(p, **fields)

    def _fill(self, out: _PodFields, cg: PodCgroup) -> PodInfo | None:
        """Put the pod fields of `cg` into `out`; the pod, when the cache knows it."""
        info = self.pods.get(cg.pod_uid)
        out["pod_uid"] = cg.pod_uid
        if info is not None:
            out["namespace"], out["pod"] = info.namespace, info.name
            out["container_name"] = info.containers.get(cg.container_id) if cg.container_id else None
        return info

    def _residual(self, r: Residual) -> Residual:
        if not r.holders:
            return r
        holders = tuple(self._holder(h) for h in r.holders)
        if all(a is b for a, b in zip(holders, r.holders)):
            return r
        return dataclasses.replace(r, holders=holders)

    def _holder(self, h: Holder) -> Holder:
        if h.pid is None:
            return h
        cg = self._cgroups.get((h.pid, h.start_time)) or self.cgroup(h.pid, h.start_time)
        if cg is None:
            return h
        fields: _HolderFields = {}
        info = self._fill(fields, cg)
        if info is not None and info.deleted_at is not None:
            fields["pod_deleted_at"] = info.deleted_at
        return dataclasses.replace(h, **fields)

    def _forget(self, current: dict[int, tuple[GpuProcess, int, GpuProcess]], now: float) -> None:
        # Identities not in this sample are dropped; "last seen" lives an hour for the driver's dead PIDs.
        if len(self._cgroups) > 2 * len(current) + 64:
            self._cgroups = {k: v for k, v in self._cgroups.items() if k[0] in current}
        if len(self._last) > len(current) + 64:
            self._last = {pid: v for pid, v in self._last.items() if pid in current or now - v[1] < FORGET_GONE_S}
