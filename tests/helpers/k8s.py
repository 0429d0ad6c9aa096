"""Shared pieces of the Kubernetes tests: the API-server stand-in as a fixture, snapshots to feed the
reconciler, and a clock the tests move by hand.
"""

from __future__ import annotations

import pytest

from gpuwarden.ops.foundation.model import GpuInfo, Holder, NodeSnapshot, Residual
from standins.kube_apiserver import FakeApiServer

NODE = "gpu-node-1"
GiB = 1 << 30


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def api():
    server = FakeApiServer().start()
    server.add_node(NODE)
    yield server
    server.stop()


def snapshot(residual: dict[int, int] | None = None, holders: dict[int, list[Holder]] | None = None,
             gpus: int = 4, drained: tuple[int, ...] = ()) -> NodeSnapshot:
    """A node of `gpus` AMD-shaped GPUs; residual bytes and holders per GPU index."""
    residual, holders = residual or {}, holders or {}
    g = tuple(GpuInfo(index=i, name="sim", vendor="amd", bus_id=f"0000:{0x10 + i:02x}:00.0", uuid=f"uuid-{i}",
                      vram_total=24 * GiB, vram_used=residual.get(i, 0)) for i in range(gpus))
    res = tuple(Residual(gpu_index=i, device_used=residual.get(i, 0), accounted=0, baseline=0,
                         residual=residual.get(i, 0), holders=tuple(holders.get(i, ())),
                         significant=residual.get(i, 0) > GiB // 2) for i in range(gpus))
    return NodeSnapshot(taken_at=0.0, hostname=NODE, backend="sim", simulated=True, gpus=g, processes=(),
                        residual=res, drained=drained)


class PodCgroup:
    """A real cgroup laid out as the kubelet's cgroupfs driver does (v1 pids hierarchy), so a process put in
    it has a kernel-written /proc/<pid>/cgroup naming the pod. `usable` is False where the hierarchy
    cannot be written (not root, no v1 pids controller): callers then skip only the pod-name checks."""

    ROOT = "/sys/fs/cgroup/pids"

    def __init__(self, pod_uid: str, container_id: str):
        import os
        self.dirs = [f"{self.ROOT}/kubepods", f"{self.ROOT}/kubepods/besteffort",
                     f"{self.ROOT}/kubepods/besteffort/pod{pod_uid}",
                     f"{self.ROOT}/kubepods/besteffort/pod{pod_uid}/{container_id}"]
        self.created = []
        self.usable = False
        try:
            for d in self.dirs:
                if not os.path.isdir(d):
                    os.mkdir(d)
                    self.created.append(d)
            self.usable = True
        except OSError:
            self.remove()

    def add(self, pid: int) -> bool:
        if not self.usable:
            return False
        try:
            with open(f"{self.dirs[-1]}/cgroup.procs", "w") as f:
                f.write(str(pid))
            return True
        except OSError:
            return False

    def remove(self) -> None:
        import os
        for d in reversed(self.created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        self.created = []


def cluster_role_rules() -> set[tuple[str, str]]:
    """(verb, resource) pairs the shipped ClusterRole grants (deploy/k8s/base/rbac.yaml)."""
    import yaml

    from helpers.paths import REPO
    docs = list(yaml.safe_load_all((REPO / "deploy/k8s/base/rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    return {(verb, res) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
