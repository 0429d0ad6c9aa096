"""The pods on this node, by UID: listed once, then kept current by a watch (fieldSelector spec.nodeName).

Deleted pods are kept for a while with the time they went, so a zombie or a leak can still be named
("pod ns/name, deleted 3 min ago"). The watch thread owns the map; readers get immutable PodInfo values.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from gpuwarden.ops.k8s.kube import Kube, KubeError, WatchStream
from gpuwarden.ops.k8s.objects import Pod

RETAIN_DELETED_S = 3600.0


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    # container id (64 hex, runtime prefix dropped) -> container name, init and ephemeral ones included
    containers: dict[str, str] = field(default_factory=dict)
    deleted_at: float | None = None  # epoch seconds; None while the pod exists

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_info(obj: Pod) -> PodInfo | None:
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        return None
    containers: dict[str, str] = {}
    status = obj.get("status") or {}
    for statuses in (status.get("initContainerStatuses"), status.get("containerStatuses"),
                     status.get("ephemeralContainerStatuses")):
        for cs in statuses or ():
            cid = (cs.get("containerID") or "").split("://", 1)[-1]
            if cid:
                containers[cid] = cs.get("name", "")
    return PodInfo(uid=uid, namespace=meta.get("namespace", ""), name=meta.get("name", ""), containers=containers)


class PodCache:
    """Pods of one node, current to the watch; `version` changes whenever anything in it does."""

    def __init__(self, kube: Kube, node_name: str, *, log: Callable[[str, str], None] = lambda level, text: None,
                 watch_timeout_s: int = 300, retain_deleted_s: float = RETAIN_DELETED_S,
                 clock: Callable[[], float] = time.time):
        self.kube = kube
        self.node_name = node_name
        self.log = log
        self.watch_timeout_s = watch_timeout_s
        self.retain_deleted_s = retain_deleted_s
        self.clock = clock
        self.version = 0
        self.problem: str | None = None  # the last failure, shown in the agent's status until it recovers
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread = threading.Thread(target=self._run, name="gpuwarden-k8s-pods", daemon=True)

    # --- readers -------------------------------------------------------------------------------
    def get(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def by_name(self, namespace: str, name: str) -> PodInfo | None:
        live = [p for p in self._pods.values() if p.namespace == namespace and p.name == name]
        # A recreated pod (same name, new UID) wins over the deleted one.
        live.sort(key=lambda p: (p.deleted_at is None, -(p.deleted_at or 0)))
        return live[-1] if live else None

    def all(self) -> list[PodInfo]:
        return list(self._pods.values())

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # --- the watch thread ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                rv: str | None = self._relist()
                backoff = 1.0
                while not self._stop.is_set() and rv is not None:
                    rv = self._watch(rv)
            except KubeError as exc:
                if self.problem != exc.message:
                    self.log("warning", f"kubernetes: pods on {self.node_name}: {exc.message}"
                                        + (f" ({exc.hint})" if exc.hint else ""))
                self.problem = exc.message
                # Backing off keeps a refused or unreachable API from turning into a request storm.
                self._stop.wait(backoff + random.random())
                backoff = min(backoff * 2, 60.0)
            except Exception as exc:  # a torn stream, a bad line: start over from a fresh list
                if self._stop.is_set():
                    return
                self.problem = f"pod watch failed: {type(exc).__name__}: {exc}"
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)

    def _relist(self) -> str:
        data = self.kube.pods_on(self.node_name)
        now = self.clock()
        fresh = {}
        for obj in data.get("items") or ():
            info = pod_info(obj)
            if info is not None:
                fresh[info.uid] = info
        with self._lock:
            pods = dict(self._pods)
            for uid, old in pods.items():
                if uid not in fresh:  # went while we were not watching
                    fresh[uid] = old if old.deleted_at is not None else _deleted(old, now)
            self._pods = self._pruned(fresh, now)
            self.version += 1
        self.problem = None
        self._synced.set()
        return (data.get("metadata") or {}).get("resourceVersion", "")

    def _watch(self, rv: str) -> str | None:
        """Follow the watch until it ends; the resourceVersion to go on from, or None to list again."""
        stream = self._stream = self.kube.watch_pods(self.node_name, rv, self.watch_timeout_s)
        try:
            for kind, obj in stream:
                if self._stop.is_set():
                    return None
                if kind == "ERROR":
                    # 410 Gone: our resourceVersion is too old to resume from; anything else: start over too.
                    return None
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion", rv)
                if kind == "BOOKMARK":
                    continue
                info = pod_info(obj)
                if info is None:
                    continue
                with self._lock:
                    pods = dict(self._pods)
                    if kind == "DELETED":
                        pods[info.uid] = _deleted(pods.get(info.uid, info), self.clock())
                    else:
                        old = pods.get(info.uid)
                        # Keep container ids seen before: a restarted container's old id still names it.
                        merged = {**(old.containers if old else {}), **info.containers}
                        pods[info.uid] = PodInfo(info.uid, info.namespace, info.name, merged)
                    self._pods = self._pruned(pods, self.clock())
                    self.version += 1
        finally:
            self._stream = None
        return rv

    def _pruned(self, pods: dict[str, PodInfo], now: float) -> dict[str, PodInfo]:
        return {u: p for u, p in pods.items() if p.deleted_at is None or now - p.deleted_at < self.retain_deleted_s}


def _deleted(info: PodInfo, when: float) -> PodInfo:
    return PodInfo(info.uid, info.namespace, info.name, info.containers, deleted_at=info.deleted_at or when)
