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
        # (namespace, pod, container) -> [(claim name, driver, pool, device)]: DRA claims the kubelet prepared
        self.claims: dict[tuple[str, str, str], list[tuple[str, str, str, str]]] = {}
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

    def assign_claim(self, namespace: str, pod: str, container: str, claim: str, driver: str, pool: str,
                     device: str) -> None:
        with self.lock:
            self.claims.setdefault((namespace, pod, container), []).append((claim, driver, pool, device))

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self.lock:
            for table in (self.assignments, self.claims):
                for key in [k for k in table if k[:2] == (namespace, pod)]:
                    del table[key]

    def List(self, request, context):
        self.calls += 1
        with self.lock:
            pods: dict[tuple[str, str], pb.PodResources] = {}
            for key in list(self.assignments) + [k for k in self.claims if k not in self.assignments]:
                ns, name, container = key
                devices = self.assignments.get(key, {})
                pr = pods.setdefault((ns, name), pb.PodResources(name=name, namespace=ns))
                pr.containers.append(pb.ContainerResources(name=container, devices=[
                    pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()],
                    dynamic_resources=[pb.DynamicResource(claim_name=claim, claim_namespace=ns, claim_resources=[
                        pb.ClaimResource(driver_name=driver, pool_name=pool, device_name=device)])
                        for claim, driver, pool, device in self.claims.get(key, [])]))
        return pb.ListPodResourcesResponse(pod_resources=list(pods.values()))
