"""What several test files share with test_k8s_dra.py: rig, and amd_devices for both tiers' DRA tests.

Taken out of test_k8s_dra.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import threading
import pytest
from helpers.k8s import NODE, Clock, snapshot
from gpuwarden.ops.config.kubernetes import KubernetesConfig
from gpuwarden.ops.services.k8s_node import KubernetesNode
from gpuwarden.ops.k8s.podresources import GpuAssignments
from gpuwarden.ops.services.k8s_remediation import FixOutcome
from gpuwarden.ops.foundation.settings import Settings
from standins.podresources_server import PodResourcesServer


# --- the agent on a DRA cluster --------------------------------------------------------------------------------
class Rig:
    """A KubernetesNode fed snapshots by hand, a pod-resources kubelet, a clean policy the test controls."""

    def __init__(self, api, tmp_path, *, grace=2.0, effect="NoSchedule", allow_reset=False, clean=None, **cfg):
        self.api, self.clock = api, Clock()
        self.kubelet = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
        self.current = snapshot()
        self.cleaned: list[tuple[int, bool]] = []
        self.lines: list[tuple[str, str]] = []

        def cleaner(gpu: int, may_reset: bool, cancelled: threading.Event) -> FixOutcome:
            self.cleaned.append((gpu, may_reset))
            return clean(gpu, may_reset) if clean else FixOutcome(True, "purged")
        self.cfg = KubernetesConfig(node_name=NODE, pod_resources_socket=self.kubelet.socket_path,
                                    post_clean_grace=grace, device_taint_effect=effect, post_clean_reset=allow_reset,
                                    **cfg)
        self.settings = Settings(state_dir=tmp_path / "state")
        self.node = KubernetesNode(self.settings, self.cfg, kube=api.kube(),
                                   log=lambda level, text: self.lines.append((level, text)),
                                   assignments=GpuAssignments(self.kubelet.socket_path), pod_resources_every_s=0.0,
                                   post_cleaner=cleaner,
                                   post_clean_tuning={"snapshot": lambda: self.current, "clock": self.clock})

    def sample(self, snap=None):
        if snap is not None:
            self.current = snap
        return self.node.process(self.current)

    def wait_clean(self):
        if self.node.cleaner is not None and self.node.cleaner._busy is not None:
            self.node.cleaner._busy.join(10)

    def close(self):
        self.node.close()
        self.kubelet.stop()


@pytest.fixture
def rig(api, tmp_path):
    made = []

    def make(**kw):
        made.append(Rig(api, tmp_path, **kw))
        return made[-1]
    yield make
    for r in made:
        r.close()


AMD = "gpu.amd.com"


def amd_devices(gpus: int = 4, partitions: dict[int, int] | None = None) -> list[dict]:
    """As ROCm/k8s-gpu-dra-driver publishes them: gpu-<card>-<render>, the standard pciBusID attribute; the
    partitions of one GPU share its bus id (docs/driver-attributes.md)."""
    out = []
    for i in range(gpus):
        bus = f"0000:{0x10 + i:02x}:00.0"
        for p in range((partitions or {}).get(i, 1)):
            kind = "amdgpu-partition" if (partitions or {}).get(i) else "amdgpu"
            out.append({"name": f"gpu-{i + p}-{128 + i + p}" if not p else f"gpu-{i}-{200 + p}",
                        "attributes": {"type": {"string": kind}, "resource.kubernetes.io/pciBusID": {"string": bus},
                                       "numaNode": {"int": 0}}})
    return out
