"""`gpuwarden doctor` on trees: a healthy node, nodes rebuilt from captured reports, NVIDIA through the replaying
pynvml stand-in and real `nvidia-smi -q -x` files, the parsers against the kernel's formats, cut checks, the schema.
"""

from __future__ import annotations

import json
import struct
import threading
import time

import pytest

from helpers.doctor_tree import RELEASE, from_rocm_smi, gzip_config, healthy_node
from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.doctor import compat
from gpuwarden.ops.doctor.checks import REGISTRY
from gpuwarden.ops.doctor.checks.health import parse_ras
from gpuwarden.ops.doctor.checks.nvidia import parse_smi_xml
from gpuwarden.ops.doctor.checks.params import parse_lockup_timeout
from gpuwarden.ops.doctor.checks.pcie import acs_control, dpm_level, parse_speed
from gpuwarden.ops.doctor.diagnose import diagnose, document
from gpuwarden.ops.doctor.model import Check, passed
from gpuwarden.ops.doctor.probe import Probe, Roots
from gpuwarden.ops.doctor.runner import run_checks, select
from gpuwarden.ops.foundation.errors import GpuwardenError
from standins import nvsmi_capture, pynvml_standin
from helpers.sysfs_tree import write


def verdicts(report) -> dict[str, str]:
    return {f.id: f.verdict for f in report.findings}


def test_healthy_node_passes_everything_that_applies(tmp_path):
    settings = healthy_node(tmp_path)
    report = diagnose(settings)
    v = verdicts(report)
    assert report.exit_code == 0, [(f.id, f.verdict, f.reason) for f in report.findings if f.verdict in ("warn", "fail")]
    for check in ("kernel", "gpu-driver", "rocm-compat", "kernel-config", "gpu-recovery", "lockup-timeout",
                  "kfd-limit", "gtt", "iommu", "pcie-link", "large-bar", "numa", "thp", "swap", "firmware",
                  "xgmi-hive", "ras"):
        assert v[check] == "pass", (check, next(f.reason for f in report.findings if f.id == check))
    assert v["nvidia-mig"] == "skip" and v["agent"] == "skip"
    assert v["memlock"] == "unknown"  # a tree is not the live node, and no engine runs to read it from
    doc = document(report)
    jsondoc.validate(doc)
    assert doc["schema"] == "gpuwarden.doctor/1" and doc["source"] == "tree" and doc["exit_code"] == 0
    rocm = next(c for c in doc["checks"] if c["id"] == "rocm-compat")
    assert "/opt/rocm/.info/version" in rocm["read"] and rocm["details"]["amdgpu_release"] == "6.4.x"


def test_kernel_config_from_proc_config_gz_and_what_is_missing(tmp_path):
    settings = healthy_node(tmp_path)
    gzip_config(settings)
    f = next(x for x in diagnose(settings, only=["kernel-config"]).findings)
    assert f.verdict == "pass" and f.details["source"] == "/proc/config.gz"
    (settings.proc_root / "config.gz").unlink()
    write(settings.boot_root / f"config-{RELEASE}", "CONFIG_HMM_MIRROR=y\n# CONFIG_HSA_AMD is not set\n")
    write(settings.sysfs_root / "module/amdgpu/version", "")  # in-tree amdgpu: its own options count too
    (settings.sysfs_root / "module/amdgpu/version").unlink()
    f = diagnose(settings, only=["kernel-config"]).findings[0]
    assert f.verdict == "fail" and "CONFIG_HSA_AMD" in f.details["missing"] and "CONFIG_MMU_NOTIFIER" in f.details["missing"]


@pytest.mark.parametrize("module, rocm, verdict, release", [
    ("6.12.12", "6.4.1-120", "pass", "6.4.x"),   # AMD's ROCm 6.4 docs: dkms status amdgpu/6.12.12-2133686
    ("6.14.14", "7.0.1", "pass", "30.10.x"),     # AMD's amdgpu 30.10 docs: amdgpu/6.14.14-2204008
    ("6.12.12", "5.6.0", "fail", "6.4.x"),       # the 6.4.x row lists 6.1.x-7.0.x only
    ("6.16.6", "7.1.0", "unknown", "30.20.x"),   # a release with no row in the matrix carried here
    ("6.7.0", "6.2.0", "unknown", None),         # the captured MI300X's module: no documented release
])
def test_rocm_against_amds_matrix(tmp_path, module, rocm, verdict, release):
    settings = healthy_node(tmp_path, amdgpu=module, rocm=rocm)
    f = diagnose(settings, only=["rocm-compat"]).findings[0]
    assert f.verdict == verdict, f.reason
    assert f.details.get("amdgpu_release") == release


def test_rocm_on_the_kernels_own_driver_is_unknown_not_guessed(tmp_path):
    f = diagnose(healthy_node(tmp_path, amdgpu=None), only=["rocm-compat"]).findings[0]
    assert f.verdict == "unknown" and "kernel's own amdgpu driver" in f.reason and f.fix


def test_compat_table_reads_versions_as_amd_writes_them():
    assert compat.release_line("6.4.1-120") == "6.4.x" and compat.release_line("7.0.1") == "7.0.x"
    assert compat.module_release("6.12.12-2133686.22.04") == "6.4.x"
    assert compat.verdict("30.30.x", "7.2.0") is True and compat.verdict("30.30.x", "6.2.4") is False
    assert compat.verdict("30.20.x", "7.1.0") is None


def test_mi300x_rebuilt_from_a_captured_rocm_smi_report(tmp_path, fixtures):
    """tests/fixtures/rocm-smi/rocm_smi_showallinfo_a_4x_mi300x.txt: 4 MI300X, driver 6.7.0, equal firmware."""
    root = tmp_path / "sys"
    found = from_rocm_smi(root, fixtures / "rocm-smi" / "rocm_smi_showallinfo_a_4x_mi300x.txt")
    assert found["driver"] == "6.7.0" and len(found["cards"]) == 4
    settings = healthy_node(tmp_path / "host", gpus=0).with_(sysfs_root=root)
    report = diagnose(settings, only=["firmware", "gpu-driver"])
    fw = next(f for f in report.findings if f.id == "firmware")
    assert fw.verdict == "pass" and "4 GPU(s), 1 model(s)" in fw.reason
    assert next(f for f in report.findings if f.id == "gpu-driver").details["amdgpu"] == "6.7.0"
    # one GPU flashed with another SOS firmware than its three siblings
    write(root / "class/drm/card2/device/fw_version/sos_fw_version", "0x0036024c\n")
    fw = diagnose(settings, only=["firmware"]).findings[0]
    assert fw.verdict == "warn" and "sos_fw_version differs" in fw.reason and "GPU 2" in fw.reason


def test_formats_the_kernel_writes():
    assert parse_ras("ue: 0\nce: 3\n") == {"ue": 0, "ce": 3}
    assert parse_ras("ue: 2\nce: 0\nde: 1\n") == {"ue": 2, "ce": 0, "de": 1}
    assert parse_ras("Query currently inaccessible\n") is None
    assert parse_speed("16.0 GT/s PCIe") == 16.0 and parse_speed("8 GT/s") == 8.0 and parse_speed("Unknown") is None
    assert dpm_level("0: 2.5GT/s, x1 310Mhz\n1: 16.0GT/s, x16 619Mhz *\n") == (1, 2)
    assert parse_lockup_timeout("") == {"GFX": None, "Compute": None, "SDMA": None, "Video": None}
    assert parse_lockup_timeout("10000") == {"GFX": 10000, "Compute": None, "SDMA": 10000, "Video": 10000}
    assert parse_lockup_timeout("10000,-1,0,5000")["Compute"] == -1


def _config_space(acs_ctl: int | None, *, extended: bool = True) -> bytes:
    """A bridge's config space as the PCIe base spec lays it out: an AER capability at 0x100 pointing to ACS at
    0x148 (capability id 0x000D, version 1; capability register at +4, control at +6)."""
    data = bytearray(4096 if extended else 256)
    if not extended:
        return bytes(data)
    struct.pack_into("<I", data, 0x100, 0x0001 | (2 << 16) | ((0x148 if acs_ctl is not None else 0) << 20))
    if acs_ctl is not None:
        struct.pack_into("<IHH", data, 0x148, 0x000D | (1 << 16), 0x005F, acs_ctl)
    return bytes(data)


def test_acs_control_from_config_space():
    assert acs_control(_config_space(0x001D)) == 0x001D  # SV, RR, CR, UF: what a BIOS with ACS on sets
    assert acs_control(_config_space(0)) == 0
    assert acs_control(_config_space(None)) is None
    with pytest.raises(ValueError):
        acs_control(_config_space(1, extended=False))  # not root: only 256 bytes readable


def test_acs_redirect_on_a_bridge_above_pcie_gpus(tmp_path):
    """A /sys/devices hierarchy: root port 0000:00:01.1 -> GPUs 0000:01:00.0 and 0000:02:00.0 (no XGMI hive)."""
    settings = healthy_node(tmp_path, gpus=0)
    root = settings.sysfs_root
    bridge = root / "devices/pci0000:00/0000:00:01.1"
    for i, bus in enumerate(("01", "02")):
        dev = bridge / f"0000:{bus}:00.0"
        write(dev / "vendor", "0x1002\n")
        write(dev / "current_link_width", "16\n")
        (root / "class/drm" / f"card{i}").mkdir(parents=True)
        (root / "class/drm" / f"card{i}" / "device").symlink_to(dev)
    (bridge / "config").write_bytes(_config_space(0x001D))
    f = diagnose(settings, only=["pcie-acs"]).findings[0]
    assert f.verdict == "warn" and f.details["redirecting_bridges"] == ["0000:00:01.1"]
    assert "setpci -s 0000:00:01.1 ECAP_ACS+0x6.w=0000" in f.fix
    (bridge / "config").write_bytes(_config_space(0x0001))
    assert diagnose(settings, only=["pcie-acs"]).findings[0].verdict == "pass"


def _nvidia_probe(tmp_path, module) -> Probe:
    settings = healthy_node(tmp_path, gpus=0)
    write(settings.sysfs_root / "module/nvidia/version", "565.57.01\n")
    return Probe(settings, Roots.of(settings), live=True, extra={"pynvml": module})


def test_nvidia_checks_on_a_captured_8x_h100(tmp_path, fixtures):
    gpus = nvsmi_capture.parse_q(fixtures / "nvidia" / "nvidia_smi_q_text_8x_h100_sxm_565.txt")
    report = run_checks(select(list(REGISTRY), ["nvidia", "firmware"]), _nvidia_probe(tmp_path, pynvml_standin.build(gpus)))
    v = verdicts(report)
    assert "all 8 GPU(s)" in next(f.reason for f in report.findings if f.id == "nvidia-persistence")
    assert v["nvidia-mig"] == "pass" and v["nvidia-ecc"] == "pass" and v["nvidia-pages"] == "pass"
    assert v["firmware"] == "pass"  # one VBIOS across the eight
    # the same node with faults planted in the capture: persistence off, ECC change pending, a row remap pending
    gpus[0].fields["Persistence Mode"] = "Disabled"
    gpus[1].fields["ECC Mode.Pending"] = "Disabled"
    gpus[3].fields["Remapped Rows.Pending"] = "Yes"
    gpus[5].fields["VBIOS Version"] = "96.00.99.00.01"
    probe = _nvidia_probe(tmp_path / "b", pynvml_standin.build(gpus))
    report = run_checks(select(list(REGISTRY), ["nvidia", "firmware"]), probe)
    by = {f.id: f for f in report.findings}
    assert by["nvidia-persistence"].verdict == "warn" and "GPU 0" in by["nvidia-persistence"].reason
    assert by["nvidia-ecc"].verdict == "warn" and "GPU 1" in by["nvidia-ecc"].reason
    assert by["nvidia-pages"].verdict == "fail" and "GPU 3" in by["nvidia-pages"].reason
    assert by["firmware"].verdict == "warn" and "GPU 5" in by["firmware"].reason


def test_nvidia_mig_node_from_a_captured_h200(tmp_path, fixtures):
    gpus = nvsmi_capture.parse_query_csv(fixtures / "nvidia" / "nvidia_smi_query_gpu_all_fields_h200_mig_590.48.01_load.csv")
    report = run_checks(select(list(REGISTRY), ["nvidia"]), _nvidia_probe(tmp_path, pynvml_standin.build(gpus)))
    by = {f.id: f for f in report.findings}
    assert by["nvidia-mig"].verdict == "pass" and "MIG on for GPU 0" in by["nvidia-mig"].reason
    assert by["nvidia-pages"].verdict == "pass" and "no retired/remapped page counters" in by["nvidia-pages"].reason


def test_nvidia_smi_xml_as_a_bundle_keeps_it(fixtures):
    xml = fixtures / "nvidia" / "nvidia_smi_q_x_rtx3080ti_linux_535.129.03_leading_blank_line.xml"
    gpus = parse_smi_xml(xml.read_text())
    assert gpus[0]["name"] == "NVIDIA GeForce RTX 3080 Ti" and gpus[0]["persistence"] is False
    assert gpus[0]["mig"] is None and gpus[0]["ecc"] is None and gpus[0]["remapped"] is None
    assert gpus[0]["vbios"] == "94.02.71.00.28" and gpus[0]["bus"] == "0000:01:00.0"
    old = parse_smi_xml((fixtures / "nvidia" / "nvidia_smi_q_x_gt730_linux_470.239.06.xml").read_text())
    assert old[0]["persistence"] is False and old[0]["vbios"] == "80.28.78.00.EA"


def test_a_hung_check_is_cut_at_its_timeout_and_not_waited_for(tmp_path):
    release = threading.Event()

    def hangs(io):
        io.note("a vendor call that never returns")
        release.wait(60)
        return passed("late")
    checks = [Check("hangs", "hangs", "test", hangs), Check("quick", "quick", "test", lambda io: passed("fine"))]
    t0 = time.monotonic()
    report = run_checks(checks, Probe(healthy_node(tmp_path, gpus=0)), timeout_s=0.3)
    took = time.monotonic() - t0
    release.set()
    hung = report.findings[0]
    assert hung.verdict == "unknown" and hung.timed_out and "cut" in hung.reason
    assert hung.read == ["a vendor call that never returns"]
    assert report.findings[1].verdict == "pass"
    assert took < 5, took  # bounded by the timeout, not by the hang


def test_hung_nvml_cuts_every_nvidia_check_at_once(tmp_path, fixtures):
    gpus = nvsmi_capture.parse_q(fixtures / "nvidia" / "nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt")
    module = pynvml_standin.build(gpus)
    stuck = threading.Event()
    module.nvmlInit = lambda: stuck.wait(60)  # a wedged GPU: nvmlInit never returns
    t0 = time.monotonic()
    report = run_checks(select(list(REGISTRY), ["nvidia-persistence", "nvidia-mig", "nvidia-ecc"]),
                        _nvidia_probe(tmp_path, module), timeout_s=0.3)
    took = time.monotonic() - t0
    stuck.set()
    assert all(f.verdict == "unknown" and f.timed_out for f in report.findings)
    assert took < 5, took


def test_a_check_that_raises_costs_one_unknown(tmp_path):
    def broken(io):
        raise KeyError("boom")
    report = run_checks([Check("broken", "broken", "t", broken)], Probe(healthy_node(tmp_path, gpus=0)))
    assert report.findings[0].verdict == "unknown" and "KeyError" in report.findings[0].reason


def test_only_names_checks_or_groups_and_refuses_unknown_ones():
    assert [c.id for c in select(list(REGISTRY), ["pcie"])] == ["iommu", "pcie-acs", "pcie-link", "large-bar", "numa"]
    assert [c.id for c in select(list(REGISTRY), ["ras", "swap"])] == ["swap", "ras"]
    with pytest.raises(GpuwardenError) as exc:
        select(list(REGISTRY), ["rass"])
    assert "rass" in exc.value.message and "ras" in exc.value.hint


def test_every_check_has_a_unique_id_and_a_title():
    ids = [c.id for c in REGISTRY]
    assert len(ids) == len(set(ids)) and all(c.title and c.group for c in REGISTRY)
    schema = json.loads((jsondoc.SCHEMA_DIR / "doctor.v1.json").read_text())
    assert schema["$id"] == "gpuwarden.doctor/1"


def test_memlock_of_running_engines_and_the_config_that_sets_it(tmp_path):
    settings = healthy_node(tmp_path, gpus=1)
    settings.config_path.write_text('[arena]\npath = "/dev/shm/a.arena"\nsize = "1GiB"\n\n'
                                    '[[engines]]\nname = "dp0"\ngpu = 0\nargv = ["/bin/sleep", "600"]\n')
    engine = settings.state_dir / "engines" / "dp0"
    engine.mkdir(parents=True)
    (engine / "state.json").write_text(json.dumps({"pid": 4242, "phase": "serving"}))
    # /proc/<pid>/limits as the kernel writes it (proc_pid_limits: name, soft, hard, units columns)
    write(settings.proc_root / "4242/limits", "Limit                     Soft Limit           Hard Limit           Units     \n"
          "Max locked memory         65536                65536                bytes     \n")
    write(settings.etc_root / "security/limits.d/90-engines.conf", "*    hard    memlock    unlimited\n")
    f = diagnose(settings, only=["memlock"]).findings[0]
    assert f.verdict == "warn" and "engine dp0 (pid 4242): 64.0 KiB" in f.reason
    assert "/proc/<pid>/limits" in f.read and f.details["config"] == [
        "/etc/security/limits.d/90-engines.conf: * hard memlock unlimited"]
    write(settings.proc_root / "4242/limits", "Max locked memory         unlimited            unlimited            bytes     \n")
    assert diagnose(settings, only=["memlock"]).findings[0].verdict == "pass"
