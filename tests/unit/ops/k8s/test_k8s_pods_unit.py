"""The unit half of tests/integration/ops/k8s/test_k8s_pods.py (its tests that need no process, socket or server); the pair's subject:
Pods by UID from a list + watch, pod attribution of processes and holders, GPUs from pod-resources,
and AMD's health service read by a client generated from the same proto."""

from __future__ import annotations



from helpers.k8s import NODE, GiB, api, snapshot  # noqa: F401
from gpuwarden.ops.k8s.podresources import GpuAssignments, gpu_index_of, list_assignments
from standins.podresources_server import PodResourcesServer


def test_gpus_come_from_the_real_pod_resources_proto(tmp_path):
    sock = str(tmp_path / "kubelet.sock")
    server = PodResourcesServer(sock).start()
    try:
        server.assign("team-a", "trainer-0", "main", "amd.com/gpu", ["0000:12:00.0"])
        server.assign("team-a", "trainer-0", "sidecar", "example.com/nic", ["eth9"])
        server.assign("team-b", "infer-1", "main", "amd.com/gpu", ["0000:10:00.0", "0000:11:00.0"])
        got = list_assignments(sock)
        assert sorted((a.pod, a.container, a.device_ids) for a in got) == [
            ("infer-1", "main", ("0000:10:00.0", "0000:11:00.0")), ("trainer-0", "main", ("0000:12:00.0",))]
        gpus = snapshot().gpus
        assert gpu_index_of("0000:12:00.0", gpus) == 2 and gpu_index_of("12:00.0", gpus) == 2
        assert gpu_index_of("UUID-3", gpus) == 3 and gpu_index_of("nope", gpus) is None
        clock = [100.0]
        ga = GpuAssignments(sock, clock=lambda: clock[0])
        ga.refresh()
        recs = ga.records(gpus, lambda ns, name: (None, None))
        assert {(r.pod, r.gpus) for r in recs} == {("trainer-0", (2,)), ("infer-1", (0, 1))}
        server.remove_pod("team-a", "trainer-0")
        clock[0] = 160.0
        ga.refresh()
        gone = [r for r in ga.records(gpus, lambda ns, name: (None, None)) if r.pod == "trainer-0"]
        assert gone[0].deleted_at == 160.0  # remembered, with when it left
    finally:
        server.stop()
    bad = GpuAssignments(str(tmp_path / "missing.sock"))
    bad.refresh()
    assert "did not answer" in bad.problem
