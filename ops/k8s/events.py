"""Kubernetes Events on the node for what gpuwarden did: purges, resets, drains (from the journal), taints.

The journal is the one record every playbook writes, whoever ran it (a person, the agent's policies); a
follower reads the lines appended since the agent started and turns finished playbooks into Events.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from gpuwarden.ops.foundation import journal, statedir
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.jsondoc import iso
from gpuwarden.ops.k8s.kube import Kube, KubeError

T = TypeVar("T")

PLAYBOOKS = {"purge": "GPUPurge", "reset": "GPUReset", "drain": "GPUDrain", "undrain": "GPUUndrain", "fix": "GPUFix"}
FINISHED = ("ok", "failed", "refused", "interrupted")


class NodeEvents:
    """Creates core/v1 Events whose involvedObject is this node (what `kubectl describe node` lists)."""

    def __init__(self, kube: Kube, node_name: str, *, namespace: str = "default",
                 log: Callable[[str, str], None] = lambda level, text: None, wall: Callable[[], float] = time.time):
        self.kube = kube
        self.node_name = node_name
        self.namespace = namespace
        self.log = log
        self.wall = wall
        self.sent = 0
        self.problem: str | None = None
        self._host = socket.gethostname()

    def __call__(self, reason: str, message: str, kind: str = "Normal") -> None:
        now = iso(self.wall())
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{self.node_name}.gpuwarden.", "namespace": self.namespace},
            # The kubelet names its node in events the same way: the node name stands in for the UID.
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_name},
            "reason": reason, "message": message[:1024], "type": kind,
            "source": {"component": "gpuwarden", "host": self._host},
            "reportingComponent": "gpuwarden", "reportingInstance": self._host,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.kube.create_event(self.namespace, body)
            self.sent += 1
            self.problem = None
        except KubeError as exc:  # an event is worth a line in the log, never a failed sample
            if exc.message != self.problem:
                self.log("warning", f"kubernetes: event {reason} not recorded: {exc.message}")
            self.problem = exc.message


class JournalFollower:
    """Journal entries appended since it was made; what they mean for the node signal."""

    MAX_READ = 4 << 20  # a burst bigger than this is read over several samples

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self._offset = self._size_and(lambda fd, size: size) or 0
        self.reset_needed: set[int] = set()

    def _size_and(self, then: Callable[[int, int], T]) -> T | None:
        """then(fd, size) on the journal opened through the checked state dir; None when it cannot be read."""
        try:
            with statedir.open_dir(self.state_dir) as d:
                fd = d.open(statedir.JOURNAL)
        except (FileNotFoundError, GpuwardenError):  # none yet, or a file we must not trust: nothing to follow
            return None
        try:
            return then(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def new_entries(self) -> list[dict[str, Any]]:
        def read(fd: int, size: int) -> bytes:
            if size < self._offset:
                self._offset = 0  # the journal was rotated or replaced
            return os.pread(fd, min(size - self._offset, self.MAX_READ), self._offset) if size > self._offset else b""
        data = self._size_and(read) or b""
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            return []  # nothing new, or a line still being written
        self._offset += last_nl + 1
        return [e for e in map(journal.parse_line, data[:last_nl].split(b"\n")) if e is not None]

    def follow(self, emit: Callable[[str, str, str], None], gpu_count: int) -> frozenset[int]:
        """Send an Event per finished playbook; return the GPUs a purge or reset verified clean just now.

        Keeps `reset_needed`: GPUs whose last reset failed, until one succeeds.
        """
        verified: set[int] = set()
        for e in self.new_entries():
            action, result = e.get("action", ""), e.get("result", "")
            if action not in PLAYBOOKS or result not in FINISHED:
                continue
            gpus = [e["gpu"]] if isinstance(e.get("gpu"), int) else list(range(gpu_count))
            where = f"GPU {e['gpu']}" if isinstance(e.get("gpu"), int) else "every GPU"
            detail = f": {e.get('failed_step')}" if e.get("failed_step") else ""
            detail += f": {'; '.join(map(str, e.get('reasons', [])))}" if e.get("reasons") else ""
            emit(PLAYBOOKS[action], f"{action} {where} by {e.get('who', '?')}: {result}{detail}",
                 "Normal" if result == "ok" else "Warning")
            # fix ends "ok" only once its GPU is verified clean (after a purge, or a reset and its verify).
            if action in ("purge", "reset", "fix") and result == "ok":
                verified.update(gpus)
            if action in ("reset", "fix") and result == "ok":
                self.reset_needed.difference_update(gpus)
            elif (action == "reset" and result == "failed") or \
                    (action == "fix" and result == "failed" and e.get("failed_step") in ("reset", "verify")):
                self.reset_needed.update(gpus)
        return frozenset(verified)
