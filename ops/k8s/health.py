"""Per-GPU health for AMD's Kubernetes device plugin: MetricsService.List on a unix socket.

The plugin (ROCm/k8s-device-plugin) asks this service each heartbeat and marks a GPU Unhealthy when its
state says "unhealthy", so the kubelet stops giving it to new pods while the node's other GPUs stay
schedulable. Opt-in. With [kubernetes] health_upstream (AMD's metrics exporter moved to that socket) it sits in
front of the exporter: each answer is the exporter's verdict merged with gpuwarden's (unhealthy if either says so).
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from gpuwarden.ops.agent import client
from gpuwarden.ops.config.kubernetes import HEALTH_SOCKET as DEFAULT_SOCKET
from gpuwarden.ops.foundation import extras

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


def merge(ours: list[GpuState], theirs: list[GpuState]) -> list[GpuState]:
    """The exporter's states with gpuwarden's verdict laid over them, matched by PCI address (else ID): unhealthy
    when either says so; GPUs only one side knows keep that side's word."""
    def key(s: GpuState) -> str:
        return s["Device"].lower() or f"id:{s['ID']}"
    mine = {key(s): s for s in ours}
    out: list[GpuState] = []
    for t in theirs:
        m = mine.pop(key(t), None)
        bad = t["Health"].lower() == UNHEALTHY or (m is not None and m["Health"] == UNHEALTHY)
        workload = sorted(set(t["AssociatedWorkload"]) | set(m["AssociatedWorkload"] if m else ()))
        out.append({**t, "Health": UNHEALTHY if bad else t["Health"], "AssociatedWorkload": workload})
    return out + list(mine.values())


def ask_upstream(socket_path: str, timeout_s: float = 1.0) -> list[GpuState]:
    """MetricsService.List of AMD's exporter on its socket; GpuwardenError when it does not answer."""
    # deferred: optional extra [kubernetes]; grpc with protobuf only when the service runs (the kubernetes extra)
    import grpc
    # deferred: optional extra [kubernetes]
    from google.protobuf import empty_pb2

    # deferred: optional extra [kubernetes]
    from gpuwarden.ops.k8s.proto import metricssvc_pb2_grpc
    try:
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            reply = metricssvc_pb2_grpc.MetricsServiceStub(channel).List(empty_pb2.Empty(), timeout=timeout_s)
    except grpc.RpcError as exc:
        raise GpuwardenError(f"AMD's metrics exporter at {socket_path} did not answer: {exc.code().name}",
                             "check the exporter, and that [kubernetes] health_upstream is its socket") from None
    return [{"ID": s.ID, "UUID": s.UUID, "Device": s.Device, "Health": s.Health,
             "AssociatedWorkload": list(s.AssociatedWorkload)} for s in reply.GPUState]


class HealthService:
    """Serves the latest states; update() swaps them in (the gRPC threads only read)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, upstream: str | None = None):
        self.socket_path = socket_path
        self.upstream = upstream
        self.upstream_problem: str | None = None
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
            ours = list(self._states)
        if not self.upstream:
            return ours
        try:
            theirs = ask_upstream(self.upstream)
        except GpuwardenError as exc:
            # The exporter's word is missing: gpuwarden's own still keeps dirty GPUs out; say so once.
            self.upstream_problem = exc.message + (f" ({exc.hint})" if exc.hint else "")
            return ours
        self.upstream_problem = None
        return merge(ours, theirs)

    def start(self) -> None:
        # deferred: optional (the kubernetes extra), and grpc with protobuf only when the service starts
        extras.need("kubernetes", "--amd-health")
        # deferred: optional extra [kubernetes]
        import grpc

        # deferred: optional extra [kubernetes]
        from gpuwarden.ops.k8s.proto import metricssvc_pb2, metricssvc_pb2_grpc
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
        if self.upstream and Path(self.upstream) == path:
            raise GpuwardenError(f"[kubernetes] health_upstream is the health socket itself ({path})",
                                 "move AMD's metrics exporter to another socket and name that one in health_upstream")
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
