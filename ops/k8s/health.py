"""Per-GPU health for AMD's Kubernetes device plugin: MetricsService.List on a unix socket.

The plugin (ROCm/k8s-device-plugin) asks this service each heartbeat and marks a GPU Unhealthy when its
state says "unhealthy", so the kubelet stops giving it to new pods while the node's other GPUs stay
schedulable. Opt-in: it takes the socket path AMD's metrics exporter would use, so run one or the other.
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from gpuwarden.ops.agent import client
from gpuwarden.ops.config.kubernetes import HEALTH_SOCKET as DEFAULT_SOCKET
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import NodeSnapshot

if TYPE_CHECKING:
    import grpc

HEALTHY, UNHEALTHY = "healthy", "unhealthy"


class GpuState(TypedDict):
    """One GPU as metricssvc.GPUState carries it (field names as in AMD's proto)."""

    ID: str
    UUID: str
    Device: str
    Health: str
    AssociatedWorkload: list[str]


def gpu_states(snap: NodeSnapshot, unhealthy: set[int] | frozenset[int]) -> list[GpuState]:
    """One state per GPU: unhealthy when it holds residual VRAM, needs a reset or is drained."""
    bad = set(unhealthy) | set(snap.drained)
    pods: dict[int, list[str]] = {}
    for p in snap.pods:
        if p.deleted_at is None:
            for g in p.gpus:
                pods.setdefault(g, []).append(f"{p.namespace}/{p.pod}")
    return [{"ID": str(g.index), "UUID": g.uuid or "", "Device": (g.bus_id or "").lower(),
             "Health": UNHEALTHY if g.index in bad else HEALTHY, "AssociatedWorkload": sorted(set(pods.get(g.index, [])))}
            for g in snap.gpus]


def _answers(path: Path) -> bool:
    try:
        client.connect(path, 0.5).close()
        return True
    except OSError:
        return False


class HealthService:
    """Serves the latest states; update() swaps them in (the gRPC threads only read)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET):
        self.socket_path = socket_path
        self.calls = 0
        self._states: list[GpuState] = []
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()

    def update(self, snap: NodeSnapshot, unhealthy: set[int] | frozenset[int]) -> None:
        states = gpu_states(snap, unhealthy)
        with self._lock:
            self._states = states

    def states(self) -> list[GpuState]:
        with self._lock:
            return list(self._states)

    def start(self) -> None:
        try:
            # deferred: optional (the kubernetes extra), and grpc with protobuf only when the service starts
            import grpc

            from gpuwarden.ops.k8s.proto import metricssvc_pb2, metricssvc_pb2_grpc
        except ImportError:
            raise GpuwardenError("grpcio is not installed", "pip install 'gpuwarden[kubernetes]'") from None
        service = self

        class Servicer(metricssvc_pb2_grpc.MetricsServiceServicer):
            def _reply(self, wanted: set[str] | None = None) -> metricssvc_pb2.GPUStateResponse:
                service.calls += 1
                states = [metricssvc_pb2.GPUState(**s) for s in service.states() if not wanted or s["ID"] in wanted]
                # Built apart: protoc's stub names the field like its message type (GPUState), and a list built
                # in the call would be checked against the stub's Mapping alternative only.
                return metricssvc_pb2.GPUStateResponse(GPUState=states)

            def List(self, request: object, context: grpc.ServicerContext) -> metricssvc_pb2.GPUStateResponse:
                return self._reply()

            def GetGPUState(self, request: metricssvc_pb2.GPUGetRequest,
                            context: grpc.ServicerContext) -> metricssvc_pb2.GPUStateResponse:
                return self._reply(set(request.ID))

        path = Path(self.socket_path)
        if _answers(path):
            raise GpuwardenError(f"something already serves the health socket {path}",
                                 "AMD's metrics exporter uses that path: run one or the other, or set "
                                 "[kubernetes] health_socket to another path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_socket():
                path.unlink()  # nobody answers on it: left by an agent that died
        except OSError as exc:
            raise GpuwardenError(f"cannot prepare the health socket {path}: {exc.strerror}",
                                 "choose another path with [kubernetes] health_socket, or fix its directory") from None
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpuwarden-health"))
        metricssvc_pb2_grpc.add_MetricsServiceServicer_to_server(Servicer(), server)
        try:
            port = server.add_insecure_port(f"unix://{path}")
        except RuntimeError:
            port = 0
        if not port:
            raise GpuwardenError(f"cannot listen on the health socket {path}",
                                 "is AMD's metrics exporter already serving there? run one or the other")
        server.start()
        os.chmod(path, 0o660)
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None
        try:
            Path(self.socket_path).unlink()
        except OSError:
            pass
