"""Device-plugin clusters: gpuwarden's health service in front of AMD's metrics exporter, over real gRPC sockets:
the device plugin hears the exporter's verdict merged with gpuwarden's (unhealthy if either says so)."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from google.protobuf import empty_pb2

from helpers.k8s import GiB, snapshot
from gpuwarden.ops.k8s.health import HealthService, merge
from gpuwarden.ops.k8s.proto import metricssvc_pb2 as pb
from gpuwarden.ops.k8s.proto import metricssvc_pb2_grpc as pb_grpc


class Exporter(pb_grpc.MetricsServiceServicer):
    """AMD's exporter as the device plugin sees it: MetricsService.List on its own socket."""

    def __init__(self, path: str, unhealthy: set[str]):
        self.unhealthy, self.calls = unhealthy, 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def List(self, request, context):
        self.calls += 1
        return pb.GPUStateResponse(GPUState=[
            pb.GPUState(ID=str(i), UUID=f"uuid-{i}", Device=f"0000:{0x10 + i:02x}:00.0",
                        Health="unhealthy" if str(i) in self.unhealthy else "healthy", AssociatedWorkload=[])
            for i in range(4)])


def plugin_view(sock: str) -> dict[str, str]:
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        reply = pb_grpc.MetricsServiceStub(ch).List(empty_pb2.Empty(), timeout=5)
    return {s.ID: s.Health for s in reply.GPUState}


def test_the_plugin_hears_unhealthy_when_either_the_exporter_or_gpuwarden_says_so(tmp_path):
    upstream, front = str(tmp_path / "exporter.socket"), str(tmp_path / "front.socket")
    exporter = Exporter(upstream, unhealthy={"0"})  # an ECC storm the exporter saw
    svc = HealthService(front, upstream=upstream)
    svc.start()
    try:
        svc.update(snapshot({2: 14 * GiB}), {2})  # residual VRAM gpuwarden saw
        assert plugin_view(front) == {"0": "unhealthy", "1": "healthy", "2": "unhealthy", "3": "healthy"}
        assert exporter.calls == 1 and svc.upstream_problem is None
        exporter.server.stop(0).wait(2)  # the exporter goes away: gpuwarden's own word still stands
        assert plugin_view(front) == {"0": "healthy", "1": "healthy", "2": "unhealthy", "3": "healthy"}
        assert "did not answer" in svc.upstream_problem and "health_upstream" in svc.upstream_problem
    finally:
        svc.stop()


def test_the_upstream_cannot_be_the_front_socket(tmp_path):
    from gpuwarden.ops.foundation.errors import GpuwardenError
    sock = str(tmp_path / "same.socket")
    with pytest.raises(GpuwardenError, match="health_upstream is the health socket itself"):
        HealthService(sock, upstream=sock).start()


def test_merge_matches_by_pci_address_and_keeps_gpus_only_one_side_knows():
    ours = [{"ID": "0", "UUID": "", "Device": "0000:10:00.0", "Health": "unhealthy", "AssociatedWorkload": ["a/p"]},
            {"ID": "7", "UUID": "", "Device": "0000:99:00.0", "Health": "healthy", "AssociatedWorkload": []}]
    theirs = [{"ID": "5", "UUID": "u", "Device": "0000:10:00.0", "Health": "healthy", "AssociatedWorkload": ["b/q"]},
              {"ID": "6", "UUID": "v", "Device": "0000:20:00.0", "Health": "Unhealthy", "AssociatedWorkload": []}]
    merged = {s["Device"]: s for s in merge(ours, theirs)}
    assert merged["0000:10:00.0"]["Health"] == "unhealthy" and merged["0000:10:00.0"]["ID"] == "5"
    assert merged["0000:10:00.0"]["AssociatedWorkload"] == ["a/p", "b/q"]
    assert merged["0000:20:00.0"]["Health"] == "unhealthy"  # the exporter's word, in its case
    assert merged["0000:99:00.0"]["Health"] == "healthy"
