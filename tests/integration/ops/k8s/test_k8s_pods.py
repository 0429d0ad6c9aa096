"""Pods by UID from a list + watch, pod attribution of processes and holders, GPUs from pod-resources,
and AMD's health service read by a client generated from the same proto."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import grpc
import pytest

from helpers.k8s import NODE, GiB, api, snapshot  # noqa: F401
from gpuwarden.ops.k8s.attribution import PodAttributor
from gpuwarden.ops.k8s.health import HealthService
from gpuwarden.ops.k8s.pods import PodCache
from gpuwarden.ops.k8s.proto import metricssvc_pb2, metricssvc_pb2_grpc
from gpuwarden.ops.foundation.model import GpuProcess, Holder
from helpers.simnode import wait_for

CID = "a534eb629135e43beb13213976e37bb2ab95cba4c0d1d0b4e27c6bc4d8091b83"
UID = "471203d1-984f-477e-9c35-db96487ffe5e"


@pytest.fixture
def cache(api):
    c = PodCache(api.kube(), NODE, watch_timeout_s=2)
    c.start()
    assert c.wait_synced(10)
    yield c
    c.stop()


def test_the_cache_follows_the_pods_of_this_node_only(api, cache):
    api.add_pod("team-a", "trainer-0", NODE, uid=UID, containers={"main": f"containerd://{CID}"})
    api.add_pod("team-b", "elsewhere", "other-node")
    info = wait_for(lambda: cache.get(UID), what="the watch to deliver the pod")
    assert (info.namespace, info.name, info.containers) == ("team-a", "trainer-0", {CID: "main"})
    assert all(p.name != "elsewhere" for p in cache.all())
    api.delete_pod("team-a", "trainer-0")
    gone = wait_for(lambda: cache.get(UID).deleted_at, what="the deletion")
    assert gone <= time.time()
    assert cache.by_name("team-a", "trainer-0").deleted_at == gone  # kept, to name what it left behind
    watches = [r for r in api.calls() if r.verb == "watch"]
    assert all(r.query["fieldSelector"] == [f"spec.nodeName={NODE}"] for r in watches)


def test_a_watch_too_old_to_resume_lists_again(api, cache):
    before = len([r for r in api.calls() if r.verb == "list"])
    api.compact()  # the next watch from our resourceVersion gets 410 Gone
    wait_for(lambda: len([r for r in api.calls() if r.verb == "list"]) > before, timeout=15,
             what="a fresh list after 410 Gone")
    api.add_pod("team-a", "late", NODE)
    wait_for(lambda: cache.by_name("team-a", "late"), timeout=15, what="the pod after the relist")


def test_attribution_names_processes_and_holders_from_cgroup_and_cache(api, cache, tmp_path):
    proc = tmp_path / "proc"
    for pid, text in ((100, f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                             f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"),
                      (200, "0::/user.slice/user-1000.slice/session-1.scope\n")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    api.add_pod("team-a", "trainer-0", NODE, uid=UID, containers={"main": f"containerd://{CID}"})
    wait_for(lambda: cache.get(UID), what="the pod")
    att = PodAttributor(proc, cache)
    procs = (GpuProcess(pid=100, start_time=5.0, user="u", command="python train.py", state="zombie", vram={2: GiB}),
             GpuProcess(pid=200, start_time=6.0, user="u", command="bash", state="sleeping"))
    holder = Holder(pid=100, start_time=5.0, reason="zombie", gpus=(2,), vram_bytes=GiB)
    snap = snapshot({2: GiB}, {2: [holder]})
    snap = dataclasses.replace(snap, processes=procs)
    out = att.annotate(snap)
    p100, p200 = out.processes
    assert (p100.namespace, p100.pod, p100.container_name, p100.pod_uid) == ("team-a", "trainer-0", "main", UID)
    assert p200.pod is None and p200 is procs[1]
    h = out.residual[2].holders[0]
    assert (h.namespace, h.pod, h.pod_deleted_at) == ("team-a", "trainer-0", None)
    reads = att.reads
    again = att.annotate(snap)
    assert att.reads == reads and again.processes[0] is out.processes[0]  # cached by pid + start time
    api.delete_pod("team-a", "trainer-0")
    wait_for(lambda: cache.get(UID).deleted_at, what="the deletion")
    later = att.annotate(snap)
    assert later.residual[2].holders[0].pod_deleted_at is not None
    # The driver still charges the PID after the process is gone: the pod it was seen in stays named.
    gone = GpuProcess(pid=100, start_time=None, user=None, command="", state="gone", vram={2: GiB})
    snap2 = dataclasses.replace(snap, processes=(gone,))
    assert att.annotate(snap2).processes[0].pod == "trainer-0"


def test_amd_health_service_as_the_device_plugin_reads_it(tmp_path):
    sock = str(tmp_path / "health" / "exporter.socket")
    svc = HealthService(sock)
    svc.start()
    try:
        snap = snapshot({2: 14 * GiB}, drained=(3,))
        svc.update(snap, {2})
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = metricssvc_pb2_grpc.MetricsServiceStub(ch)
            from google.protobuf import empty_pb2
            reply = stub.List(empty_pb2.Empty(), timeout=5)
            one = stub.GetGPUState(metricssvc_pb2.GPUGetRequest(ID=["0"]), timeout=5)
        health = {s.Device: s.Health for s in reply.GPUState}
        # The plugin matches Device to its device ids (PCI addresses) and takes "unhealthy" as Unhealthy.
        assert health == {"0000:10:00.0": "healthy", "0000:11:00.0": "healthy",
                          "0000:12:00.0": "unhealthy", "0000:13:00.0": "unhealthy"}
        assert [s.ID for s in one.GPUState] == ["0"]
        assert oct(os.stat(sock).st_mode & 0o777) == "0o660"
        with pytest.raises(Exception, match="already serves"):
            HealthService(sock).start()  # never steals a live socket (AMD's exporter, another agent)
    finally:
        svc.stop()
    assert not Path(sock).exists()
