"""Topology and blast radius: XGMI hives from KFD, PCIe parents from the /sys/devices hierarchy, NUMA nodes, and
which GPUs (and engines) one reset reaches; `status --topology` on the simulated hive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.model import EngineInfo, GpuInfo, NodeSnapshot
from gpuwarden.ops.node.topology import reset_reach, topology
from helpers.sysfs_tree import write


def _snap(gpus, engines=()):
    return NodeSnapshot(taken_at=1.0, hostname="h", backend="sysfs", simulated=False, gpus=tuple(gpus),
                        processes=(), residual=(), engines=tuple(engines))


def _pci_gpu(root, path: str, numa: str, card: int):
    """A GPU at /sys/devices/<path> with class/drm/cardN/device linking there, as the kernel lays it out."""
    dev = root / "devices" / path
    write(dev / "numa_node", numa)
    write(dev / "uevent", f"DRIVER=amdgpu\nPCI_SLOT_NAME={path.rsplit('/', 1)[1]}\n")
    (root / "class/drm" / f"card{card}").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(dev, root / "class/drm" / f"card{card}"), root / "class/drm" / f"card{card}/device")


def test_switch_numa_and_hive_from_the_tree(tmp_path):
    root = tmp_path / "sys"
    _pci_gpu(root, "pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0", "0\n", 0)
    _pci_gpu(root, "pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:04:00.0", "0\n", 1)
    _pci_gpu(root, "pci0000:80/0000:80:01.1/0000:81:00.0", "-1\n", 2)
    gpus = [GpuInfo(index=0, name="a", vendor="amd", bus_id="0000:03:00.0", hive_id="0xabc"),
            GpuInfo(index=1, name="b", vendor="amd", bus_id="0000:04:00.0", hive_id="0xabc"),
            GpuInfo(index=2, name="c", vendor="amd", bus_id="0000:81:00.0")]
    engines = [EngineInfo(name="dp0", gpu=0, phase="serving"), EngineInfo(name="dp1", gpu=1, phase="serving"),
               EngineInfo(name="old", gpu=1, phase="exited"), EngineInfo(name="dp2", gpu=2, phase="serving")]
    doc = topology(_snap(gpus, engines), root)
    jsondoc.validate(doc)
    g0, g1, g2 = doc["gpus"]
    assert g0["pcie_parent"] == g1["pcie_parent"] == "0000:02:00.0" and g0["same_pcie_parent"] == [0, 1]
    assert g0["pcie_path"] == ["0000:00:01.1", "0000:01:00.0", "0000:02:00.0"]
    assert (g0["numa_node"], g2["numa_node"]) == (0, None)  # -1: the platform does not say
    assert g0["reset_scope"] == [0, 1] and g2["reset_scope"] == [2] and g0["engines_in_scope"] == ["dp0", "dp1"]
    assert reset_reach(doc, 0) == "resetting GPU 0 also resets GPU 1 of hive 0xabc: engines dp0, dp1 will lose " \
                                  "their contexts"
    assert reset_reach(doc, 2) == "resetting GPU 2: engine dp2 will lose its context"


def test_status_topology_on_the_simulated_hive(cli, state_dir):
    assert cli("sim", "init", "--gpus", "8", "--hive").returncode == 0
    proc = cli("--backend", "sim", "status", "--topology", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert [g["reset_scope"] for g in doc["gpus"]] == [list(range(8))] * 8
    assert {g["numa_node"] for g in doc["gpus"]} == {0} and {g["pcie_parent"] for g in doc["gpus"]} == {None}
    text = cli("--backend", "sim", "status", "--topology").stdout
    assert "resetting GPU 2 also resets GPUs 0-1, 3-7 of hive 0x51510001" in text
    assert "PCIe parents n/a" in text


def test_cpx_partitions_are_one_physical_device_and_a_reset_takes_them_all():
    # A CPX MI300X: 8 logical GPUs at one PCI address (KFD reports the physical device's location for each).
    gpus = [GpuInfo(index=i, name="p", vendor="amd", bus_id="0000:11:00.0", compute_partition="CPX",
                    memory_partition="NPS4") for i in range(8)]
    gpus.append(GpuInfo(index=8, name="q", vendor="amd", bus_id="0000:21:00.0", compute_partition="SPX",
                        memory_partition="NPS1"))
    doc = topology(_snap(gpus, [EngineInfo(name="dp3", gpu=3, phase="serving")]), Path("/nonexistent"))
    jsondoc.validate(doc)
    assert doc["gpus"][2]["reset_scope"] == list(range(8)) and doc["gpus"][8]["reset_scope"] == [8]
    assert reset_reach(doc, 2) == ("resetting GPU 2 resets its physical device 0000:11:00.0, so also GPUs 0-1, 3-7 "
                                   "(CPX of the same device): engine dp3 will lose its context")
    assert reset_reach(doc, 8) is None


def test_sim_reports_its_partition_modes(settings):
    from gpuwarden.ops.node.backends.sim import SimBackend
    backend = SimBackend(settings, create=True)
    try:
        gpu = backend.gpus()[0]
    finally:
        backend.close()
    assert (gpu.compute_partition, gpu.memory_partition) == ("SPX", "NPS1")
