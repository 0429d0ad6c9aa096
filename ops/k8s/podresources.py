"""Which GPUs the kubelet gave to which pod: the pod-resources gRPC API's List, mapped to GPU indexes.

Device ids are PCI addresses for amd.com/gpu and GPU UUIDs for nvidia.com/gpu; both are matched to the
GPUs of the snapshot. Pods that leave the list are remembered for a while with the time they went.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

from gpuwarden.ops.config.kubernetes import PODRESOURCES_SOCKET as DEFAULT_SOCKET
from gpuwarden.ops.foundation import extras

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import GpuInfo, PodGpus

GPU_RESOURCES = ("amd.com/gpu", "nvidia.com/gpu")
RETAIN_GONE_S = 3600.0
DRA = "dra"  # Assignment.resource of a claim's device; its id is "driver/pool/device"


@dataclass(frozen=True)
class Assignment:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def list_assignments(socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> list[Assignment]:
    """One List call; GpuwardenError (one line) when the socket is missing or the kubelet does not answer."""
    # deferred: optional (the kubernetes extra), and grpc with protobuf only when the kubelet is asked
    extras.need("kubernetes", "the kubelet's pod-resources API")
    # deferred: optional extra [kubernetes]
    import grpc

    # deferred: optional extra [kubernetes]
    from gpuwarden.ops.k8s.proto import podresources_pb2, podresources_pb2_grpc
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
            # DRA: the claim's devices as the kubelet prepared them (driver, pool, device of a ResourceSlice).
            ids = tuple(f"{r.driver_name}/{r.pool_name}/{r.device_name}"
                        for d in c.dynamic_resources for r in d.claim_resources if r.device_name)
            if ids:
                out.append(Assignment(pod.namespace, pod.name, c.name, DRA, ids))
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

    def gone(self) -> list[tuple[Assignment, float]]:
        """Assignments that left the list lately, with when (the agent's post-clean starts from these)."""
        return list(self._gone.values())

    def current(self) -> list[Assignment]:
        return list(self._current.values())

    @staticmethod
    def gpus_of(a: Assignment, gpus: tuple[GpuInfo, ...],
                dra: Callable[[str, str, str], tuple[int, ...]] | None = None) -> tuple[int, ...]:
        """The GPU indexes an assignment names; a DRA device through `dra` (driver, pool, device) -> GPUs."""
        if a.resource == DRA:
            found: set[int] = set()
            for ref in a.device_ids:
                driver, _, rest = ref.partition("/")
                pool, _, device = rest.rpartition("/")
                found.update(dra(driver, pool, device) if dra else ())
            return tuple(sorted(found))
        return tuple(sorted(i for i in (gpu_index_of(d, gpus) for d in a.device_ids) if i is not None))

    def records(self, gpus: tuple[GpuInfo, ...], uid_of: Callable[[str, str], tuple[str | None, float | None]],
                dra: Callable[[str, str, str], tuple[int, ...]] | None = None) -> tuple[PodGpus, ...]:
        """PodGpus for current and recently gone assignments; uid_of(ns, name) -> (uid, deleted_at)."""
        out = []
        for a, gone in [(a, None) for a in self._current.values()] + list(self._gone.values()):
            idx = self.gpus_of(a, gpus, dra)
            uid, deleted_at = uid_of(a.namespace, a.pod)
            out.append(PodGpus(namespace=a.namespace, pod=a.pod, container_name=a.container, gpus=idx,
                               pod_uid=uid, deleted_at=deleted_at if deleted_at is not None else gone))
        return tuple(out)
