"""The Kubernetes side of the agent, run as its own loop until the node agent (issue 10) calls
KubernetesNode.process() from its sampling: sample, process, serve the last snapshot, repeat.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..jsondoc import document, iso
from ..model import NodeSnapshot
from ..settings import Settings
from .agentlink import SnapshotServer, socket_path
from .node import KubernetesNode


class KubernetesLoop:
    """Samples every `interval` seconds (from the end of the last sample) until stop() is called."""

    def __init__(self, settings: Settings, node: KubernetesNode, *, interval: float = 1.0,
                 log: Callable[[str], None] = print, serve_socket: bool = True):
        self.settings = settings
        self.node = node
        self.interval = interval
        self.log = log
        self.serve_socket = serve_socket
        self.samples = 0
        self.last: NodeSnapshot | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def latest_document(self) -> dict | None:
        snap = self.last
        if snap is None:
            return None
        return document("snapshot", {**snap.to_dict(), "taken_at_iso": iso(snap.taken_at),
                                     "kubernetes": self.node.status()})

    def run(self) -> None:
        from ..snapshot import Sampler
        sampler = Sampler(self.settings)
        server = SnapshotServer(socket_path(self.settings.state_dir), self.latest_document) \
            if self.serve_socket else None
        self.node.start()
        self.log(f"kubernetes: node {self.node.node_name}, policy {self.node.cfg.policy}, "
                 f"taint after {self.node.cfg.taint_after:g}s" +
                 (f", AMD health on {self.node.health.socket_path}" if self.node.health else ""))
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    self.last = self.node.process(sampler.snapshot())
                except Exception as exc:  # one bad sample is a log line; the next one may work
                    self.log(f"sample failed: {type(exc).__name__}: {exc}")
                self.samples += 1
                wait = self.interval - (time.monotonic() - t0)
                due = self.node.wake_in()
                if due is not None:
                    wait = min(wait, due + 0.01)
                self._stop.wait(max(0.0, wait))
        finally:
            if server is not None:
                server.close()
            self.node.close()
            sampler.close()
