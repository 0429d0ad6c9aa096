"""The kubelet's pod-resources gRPC service (List) on a unix socket, from the real proto (ops/k8s/proto).

A kubelet cannot run here; this serves what tests put in `assignments`, through the generated servicer,
so gpuwarden's client meets the real wire format.
"""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

from gpuwarden.ops.k8s.proto import podresources_pb2 as pb
from gpuwarden.ops.k8s.proto import podresources_pb2_grpc as pb_grpc


class PodResourcesServer(pb_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self.lock = threading.Lock()
        # (namespace, pod, container) -> {resource name: [device ids]}
        self.assignments: dict[tuple[str, str, str], dict[str, list[str]]] = {}
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{socket_path}")

    def start(self) -> "PodResourcesServer":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(0).wait(2)

    def assign(self, namespace: str, pod: str, container: str, resource: str, device_ids: list[str]) -> None:
        with self.lock:
            self.assignments.setdefault((namespace, pod, container), {})[resource] = list(device_ids)

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self.lock:
            for key in [k for k in self.assignments if k[:2] == (namespace, pod)]:
                del self.assignments[key]

    def List(self, request, context):
        self.calls += 1
        with self.lock:
            pods: dict[tuple[str, str], pb.PodResources] = {}
            for (ns, name, container), devices in self.assignments.items():
                pr = pods.setdefault((ns, name), pb.PodResources(name=name, namespace=ns))
                pr.containers.append(pb.ContainerResources(name=container, devices=[
                    pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()]))
        return pb.ListPodResourcesResponse(pod_resources=list(pods.values()))
