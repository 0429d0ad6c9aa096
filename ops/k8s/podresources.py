"""Which GPUs the kubelet gave to which pod: the pod-resources gRPC API's List, mapped to GPU indexes.

Device ids are PCI addresses for amd.com/gpu and GPU UUIDs for nvidia.com/gpu; both are matched to the
GPUs of the snapshot. Pods that leave the list are remembered for a while with the time they went.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

from gpuwarden.ops.config.kubernetes import PODRESOURCES_SOCKET as DEFAULT_SOCKET
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import GpuInfo, PodGpus

GPU_RESOURCES = ("amd.com/gpu", "nvidia.com/gpu")
RETAIN_GONE_S = 3600.0


@dataclass(frozen=True)
class Assignment:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def list_assignments(socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> list[Assignment]:
    """One List call; GpuwardenError (one line) when the socket is missing or the kubelet does not answer."""
    try:
        # deferred: optional (the kubernetes extra), and grpc with protobuf only when the kubelet is asked
        import grpc

        from gpuwarden.ops.k8s.proto import podresources_pb2, podresources_pb2_grpc
    except ImportError:
        raise GpuwardenError("grpcio is not installed", "pip install 'gpuwarden[kubernetes]'") from None
    try:
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            reply = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        raise GpuwardenError(f"the kubelet's pod-resources API at {socket_path} did not answer: "
                             f"{exc.code().name} {exc.details() or ''}".strip(),
                             "mount /var/lib/kubelet/pod-resources into the agent (see deploy/k8s/base/daemonset.yaml)") from None
    out = []
    for pod in reply.pod_resources:
        for c in pod.containers:
            for dev in c.devices:
                if dev.resource_name in GPU_RESOURCES or dev.resource_name.endswith("/gpu"):
                    out.append(Assignment(pod.namespace, pod.name, c.name, dev.resource_name, tuple(dev.device_ids)))
    return out


def _norm_bus(bus: str) -> str:
    bus = bus.lower()
    return bus if bus.count(":") == 2 else f"0000:{bus}"


def gpu_index_of(device_id: str, gpus: Iterable[GpuInfo]) -> int | None:
    """The GPU a device-plugin id names: PCI address (AMD), UUID (NVIDIA), or a bare index."""
    want = device_id.strip()
    for g in gpus:
        if g.uuid and want.lower() == g.uuid.lower():
            return g.index
        if g.bus_id and ":" in want and _norm_bus(want) == _norm_bus(g.bus_id):
            return g.index
    return int(want) if want.isdigit() and any(g.index == int(want) for g in gpus) else None


class GpuAssignments:
    """Keeps the latest List (and the recently gone) as PodGpus records for the snapshot."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, lister: Callable[[str], list[Assignment]] = list_assignments,
                 retain_s: float = RETAIN_GONE_S, clock: Callable[[], float] = time.time):
        self.socket_path = socket_path
        self.lister = lister
        self.retain_s = retain_s
        self.clock = clock
        self.problem: str | None = None
        self._current: dict[tuple[str, str, str], Assignment] = {}
        self._gone: dict[tuple[str, str, str], tuple[Assignment, float]] = {}

    def refresh(self) -> None:
        try:
            fresh = {(a.namespace, a.pod, a.container): a for a in self.lister(self.socket_path)}
        except GpuwardenError as exc:
            self.problem = exc.message
            return
        self.problem = None
        now = self.clock()
        for key, a in self._current.items():
            if key not in fresh:
                self._gone[key] = (a, now)
        for key in fresh:
            self._gone.pop(key, None)
        self._gone = {k: v for k, v in self._gone.items() if now - v[1] < self.retain_s}
        self._current = fresh

    def records(self, gpus: tuple[GpuInfo, ...], uid_of: Callable[[str, str], tuple[str | None, float | None]]
                ) -> tuple[PodGpus, ...]:
        """PodGpus for current and recently gone assignments; uid_of(ns, name) -> (uid, deleted_at)."""
        out = []
        for a, gone in [(a, None) for a in self._current.values()] + list(self._gone.values()):
            idx = tuple(sorted(i for i in (gpu_index_of(d, gpus) for d in a.device_ids) if i is not None))
            uid, deleted_at = uid_of(a.namespace, a.pod)
            out.append(PodGpus(namespace=a.namespace, pod=a.pod, container_name=a.container, gpus=idx,
                               pod_uid=uid, deleted_at=deleted_at if deleted_at is not None else gone))
        return tuple(out)
