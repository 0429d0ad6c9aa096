"""Per-GPU sensors (clocks, fan, power cap, memory activity, PCIe link, temperatures by sensor, RAS): the sysfs
parsers on captured and kernel-format files, the sim node's tree through the real backend, and the JSON form.
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.node.backends import sensors
from gpuwarden.ops.node.backends.sim import SimBackend
from gpuwarden.ops.node.backends.sysfs import SysfsBackend
from gpuwarden.ops.foundation.model import snapshot_from_dict
from gpuwarden.ops.sampling import take_snapshot
from standins.nvsmi_capture import parse_q
from helpers.sysfs_tree import add_card, add_kfd_node, write


def test_dpm_table_of_a_real_card(fixtures):
    text = (fixtures / "sysfs/amdgpu_pp_dpm_sclk_rx580.txt").read_text()
    assert sensors.parse_dpm(text) == (900.0, 1366.0)


# The kernel's formats, file by file: what each parser makes of them.
@pytest.mark.parametrize("parser, text, expected", [
    # SMU 13 boards print "S: <clock>Mhz *" while the engine sleeps: current, not the top level.
    ("parse_dpm", "S: 19Mhz *\n0: 500Mhz \n1: 2100Mhz \n", (19.0, 2100.0)),
    ("parse_dpm", "", (None, None)),
    ("parse_dpm", "0: 500Mhz \n1: 2100Mhz \n", (None, 2100.0)),  # no star: current unknown
    ("parse_link_speed", "16.0 GT/s PCIe\n", 16.0),
    ("parse_link_speed", "8 GT/s\n", 8.0),
    ("parse_link_speed", "Unknown\n", None),
    ("parse_ras", "ue: 1\nce: 7\nde: 0\n", {"ue": 1, "ce": 7, "de": 0}),
    ("parse_ras", "Query currently inaccessible\n", None),
    ("parse_bad_pages", "0x00000001 : 0x00001000 : R\n0x00000002 : 0x00001000 : P\n0x00000003 : 0x00001000 : R\n",
     (2, 1)),
    ("parse_bad_pages", "", (0, 0)),
])
def test_sysfs_formats(parser, text, expected):
    assert getattr(sensors, parser)(text) == expected


def _mi300_like(root, *, threshold: str | None = None):
    """A card with amdgpu's MI300-class sensor files (no edge sensor, no fan), in the kernel's formats."""
    dev = add_card(root, 0, vram_total="206141652992\n", vram_used="1073741824\n", bus="0000:11:00.0",
                   render_minor=128, extra={
                       "pp_dpm_sclk": "S: 19Mhz \n0: 500Mhz \n1: 1400Mhz *\n2: 2100Mhz \n",
                       "pp_dpm_mclk": "0: 900Mhz \n1: 1300Mhz *\n",
                       "mem_busy_percent": "37\n", "current_link_speed": "16.0 GT/s PCIe\n",
                       "current_link_width": "8\n", "max_link_speed": "32.0 GT/s PCIe\n", "max_link_width": "16\n",
                       "ras/umc_err_count": "ue: 0\nce: 5\nde: 1\n", "ras/gfx_err_count": "ue: 2\nce: 0\n",
                       "ras/sdma_err_count": "Query currently inaccessible\n",
                       "ras/gpu_vram_bad_pages": "0x00000010 : 0x00001000 : R\n0x00000011 : 0x00001000 : P\n",
                       "hwmon/hwmon3/temp2_input": "61000\n", "hwmon/hwmon3/temp2_label": "junction\n",
                       "hwmon/hwmon3/temp3_input": "48000\n", "hwmon/hwmon3/temp3_label": "mem\n",
                       "hwmon/hwmon3/power1_average": "312000000\n", "hwmon/hwmon3/power1_cap": "750000000\n"})
    add_kfd_node(root, 1, 41000, "gfx_target_version 90402\nlocation_id 4352\ndomain 0\ndrm_render_minor 128\n")
    if threshold is not None:
        write(root / "module/amdgpu/parameters/bad_page_threshold", threshold)
    return dev


@contextlib.contextmanager
def sysfs_backend(tmp_path):
    """The real sysfs backend over the tree under tmp_path/sys, closed afterwards."""
    backend = SysfsBackend(sysfs_root=tmp_path / "sys", dev_root=tmp_path / "dev")
    try:
        yield backend
    finally:
        backend.close()


def sim_snapshot(settings):
    """One snapshot of the sim node (made here) through the real sampler."""
    backend = SimBackend(settings, create=True)
    try:
        return take_snapshot(settings, backend)
    finally:
        backend.close()


def test_sysfs_backend_reads_every_sensor_the_card_has(tmp_path):
    root = tmp_path / "sys"
    _mi300_like(root, threshold="8\n")
    with sysfs_backend(tmp_path) as backend:
        (gpu,) = backend.gpus()
    s = gpu.sensors
    assert (s.sclk_mhz, s.sclk_max_mhz, s.mclk_mhz, s.mclk_max_mhz) == (1400.0, 2100.0, 1300.0, 1300.0)
    assert s.mem_busy_percent == 37.0 and s.power_cap_w == 750.0 and gpu.power_w == 312.0
    assert (s.link_speed_gts, s.link_max_speed_gts, s.link_width, s.link_max_width) == (16.0, 32.0, 8, 16)
    assert s.temperatures == {"junction": 61.0, "memory": 48.0}
    assert gpu.temperature_c == 61.0  # no temp1 (edge) on this board: the junction sensor stands in
    assert s.ras == {"umc": {"ue": 0, "ce": 5, "de": 1}, "gfx": {"ue": 2, "ce": 0}}  # sdma inaccessible: left out
    assert (s.ecc_corrected, s.ecc_uncorrected, s.retired_pages, s.pending_pages) == (5, 2, 1, 1)
    assert s.bad_page_threshold == 8
    # What the card does not have is None ("n/a"), never a made-up number.
    assert s.fan_rpm is None and s.fan_percent is None and s.throttle is None


def test_fan_from_hwmon_and_auto_threshold_unknown(tmp_path):
    root = tmp_path / "sys"
    dev = _mi300_like(root, threshold="-1\n")
    write(dev / "hwmon/hwmon3/fan1_input", "1650\n")
    write(dev / "hwmon/hwmon3/pwm1", "102\n")
    write(dev / "hwmon/hwmon3/pwm1_max", "255\n")
    with sysfs_backend(tmp_path) as backend:
        s = backend.gpus()[0].sensors
    assert s.fan_rpm == 1650 and s.fan_percent == 40.0
    assert s.bad_page_threshold is None  # -1: the driver picks it and does not say


def test_a_card_without_sensor_files_reads_all_none(tmp_path):
    root = tmp_path / "sys"
    add_card(root, 0, vram_total="8573157376\n", vram_used="1\n", bus="0000:03:00.0")
    with sysfs_backend(tmp_path) as backend:
        s = backend.gpus()[0].sensors
    assert s.sclk_mhz is None and s.link_width is None and s.temperatures == {} and s.ras == {}
    assert s.ecc_corrected is None and s.retired_pages is None


def test_unchanged_files_give_back_the_same_record_and_changes_show(tmp_path):
    root = tmp_path / "sys"
    dev = _mi300_like(root)
    with sysfs_backend(tmp_path) as backend:
        first = backend.gpus()[0].sensors
        assert backend.gpus()[0].sensors is first
        # In place, as sysfs attributes change: the held descriptor sees the new text.
        with open(dev / "pp_dpm_sclk", "r+") as f:
            f.write("S: 19Mhz \n0: 500Mhz \n1: 1400Mhz \n2: 2100Mhz *\n")
        assert backend.gpus()[0].sensors.sclk_mhz == 2100.0


def test_sim_node_grows_the_files_and_the_real_parsers_read_them(settings):
    backend = SimBackend(settings, create=True)
    try:
        idle = backend.gpus()[1].sensors
        assert idle.sclk_mhz == 500.0 and idle.sclk_max_mhz == 2100.0 and idle.mem_busy_percent == 0.0
        assert set(idle.temperatures) == {"edge", "junction", "memory"}
        assert idle.power_cap_w == 750.0 and idle.link_width == idle.link_max_width == 16
        assert idle.fan_rpm is None  # MI300X is passively cooled
        assert idle.ras["umc"] == {"ue": 0, "ce": 0, "de": 0} and idle.retired_pages == 0
        backend.node.allocate(os.getpid(), 1, 1 << 30)
        busy = backend.gpus()[1].sensors
        assert busy.sclk_mhz == 1300.0 and busy.mem_busy_percent > 0
        assert busy.temperatures["junction"] > idle.temperatures["junction"]
    finally:
        backend.node.free(os.getpid())
        backend.close()


def test_status_json_carries_sensors_validates_and_reads_back(settings):
    snap = sim_snapshot(settings)
    doc = json.loads(snap.to_json())
    jsondoc.validate(doc)
    gpu = doc["gpus"][0]["sensors"]
    assert gpu["sclk_max_mhz"] == 2100.0 and gpu["fan_rpm"] is None and gpu["throttle"] is None
    back = snapshot_from_dict(doc)
    assert back.gpus[0].sensors == snap.gpus[0].sensors
    # An older document (no "sensors") still reads, and a reader of the old schema still validates the new one.
    del doc["gpus"][0]["sensors"]
    assert snapshot_from_dict(doc).gpus[0].sensors is None


def test_old_snapshot_schema_accepts_the_new_document(settings):
    """A reader holding the schema as it was before sensors (no "sensors" property) validates today's output."""
    import jsonschema
    old = json.loads(jsondoc.schema_file("gpuwarden.snapshot/1").read_text())
    assert old["$defs"]["gpu"]["properties"].pop("sensors")
    old["$defs"].pop("sensors", None)
    doc = json.loads(sim_snapshot(settings).to_json())
    assert "sensors" in doc["gpus"][0]
    jsonschema.validate(doc, old)


# --- NVIDIA: a stand-in pynvml replaying captured `nvidia-smi -q` reports --------------------------------------
def _nvml(settings, gpus):
    """The NVML backend over a stand-in pynvml answering as the captured GPUs did."""
    from gpuwarden.ops.node.backends.nvml import NvmlBackend
    from standins import pynvml_standin
    mod = pynvml_standin.build(gpus)
    return NvmlBackend(settings, module=mod), mod


def test_nvml_sensors_match_what_nvidia_smi_printed_under_load(settings, fixtures):
    backend, _ = _nvml(settings, parse_q(fixtures / "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt"))
    try:
        (gpu,) = backend.gpus()
    finally:
        backend.close()
    s = gpu.sensors
    # Clocks 1980/2619 MHz, Max Clocks the same, Current Power Limit 700 W, PCIe Gen5 x16 of Gen5 x16.
    assert (s.sclk_mhz, s.sclk_max_mhz, s.mclk_mhz, s.mclk_max_mhz) == (1980.0, 1980.0, 2619.0, 2619.0)
    assert s.power_cap_w == 700.0
    assert (s.link_speed_gts, s.link_max_speed_gts, s.link_width, s.link_max_width) == (32.0, 32.0, 16, 16)
    assert s.throttle == ()  # every Clocks Event Reason "Not Active"
    assert s.fan_percent is None and s.fan_rpm is None  # "Fan Speed : N/A" (SXM board)
    assert s.temperatures == {"gpu": gpu.temperature_c} and s.ecc_corrected == 0 and s.ecc_uncorrected == 0
    assert s.mem_busy_percent is not None


def test_nvml_reasons_and_the_slow_group(settings, fixtures):
    from gpuwarden.ops.node.backends import nvml_sensors
    gpus = parse_q(fixtures / "nvidia/nvidia_smi_q_text_8x_h100_sxm_565.txt")
    assert gpus[0].fields["Clocks Event Reasons.Idle"] == "Active"  # the capture's idle H100s
    gpus[0].fields["Clocks Event Reasons.SW Power Cap"] = "Active"  # as if capped at its power limit
    backend, mod = _nvml(settings, gpus)
    try:
        first = backend.gpus()
        assert first[0].sensors.throttle == ("idle", "sw-power-cap") and first[1].sensors.throttle == ("idle",)
        ecc_calls = mod.calls.count("nvmlDeviceGetTotalEccErrors")
        for _ in range(nvml_sensors.SLOW_EVERY - 1):
            backend.gpus()
        assert mod.calls.count("nvmlDeviceGetTotalEccErrors") == ecc_calls  # ECC asked once per SLOW_EVERY
        assert backend.gpus()[1].sensors is first[1].sensors  # nothing changed: the same record
    finally:
        backend.close()


def test_nvml_temperature_and_the_memory_clock_are_asked_every_medium_refreshes(settings, fixtures):
    from gpuwarden.ops.node.backends import nvml_sensors
    gpus = parse_q(fixtures / "nvidia/nvidia_smi_q_text_8x_h100_sxm_565.txt")
    backend, mod = _nvml(settings, gpus)
    n = len(gpus)

    def asked(name):
        return sum(1 for c in mod.calls if c.startswith(name))
    try:
        first = backend.gpus()
        assert first[0].temperature_c is not None and first[0].sensors.mclk_mhz is not None
        temps, clocks = asked("nvmlDeviceGetTemperature"), asked("nvmlDeviceGetClockInfo")
        assert temps == n and clocks == 2 * n  # the first refresh asks everything
        for _ in range(nvml_sensors.MEDIUM_EVERY - 1):
            later = backend.gpus()
        assert later[0].temperature_c == first[0].temperature_c and later[0].sensors.mclk_mhz == 2619.0
        assert asked("nvmlDeviceGetTemperature") == temps  # not asked in between
        assert asked("nvmlDeviceGetClockInfo") == clocks + (nvml_sensors.MEDIUM_EVERY - 1) * n  # the SM clock only
        backend.gpus()
        assert asked("nvmlDeviceGetTemperature") == 2 * n  # the next medium refresh
    finally:
        backend.close()


# --- amdsmi 6.x and 7.x: the stand-in built from each version's real API, replaying captured amd-smi output -----
@pytest.mark.parametrize("version", ["rocm-6.0.0", "rocm-6.1.0", "rocm-6.2.0", "amdsmi-7.0.2"])
def test_amdsmi_sensors_from_a_capture_and_na_for_the_rest(version, settings, fixtures):
    from gpuwarden.ops.node.backends.amdsmi_backend import AmdSmiBackend
    from standins import amd_smi_capture, amdsmi_standin
    node = amd_smi_capture.monitor_node(fixtures / "amd-smi/amd_smi_monitor_process_rocm640.txt")
    mod = amdsmi_standin.build(version, node)
    backend = AmdSmiBackend(settings, module=mod)
    try:
        [gpu] = backend.gpus()
        backend.gpus()
    finally:
        backend.close()
    s = gpu.sensors
    # amd-smi monitor showed GPU_T 49 C (hotspot) and MEM_T; MI300X has no edge sensor.
    assert s.temperatures["junction"] == 49.0 and "memory" in s.temperatures and "edge" not in s.temperatures
    # Nothing else was captured: every other field is n/a, none invented.
    assert s.sclk_mhz is None and s.power_cap_w is None and s.link_width is None and s.fan_rpm is None
    assert s.mem_busy_percent is None and s.ras == {} and s.ecc_corrected is None
    assert mod.calls.count("amdsmi_get_gpu_ecc_count") <= len(mod.AmdSmiGpuBlock)  # slow group: once for 2 refreshes


def test_amdsmi_units_and_throttle_bits():
    from gpuwarden.ops.node.backends.amdsmi_sensors import gts, throttle_names
    assert gts(16000) == 16.0 and gts(32) == 32.0 and gts(0) is None and gts(None) is None
    assert throttle_names(0) == () and throttle_names(None) is None
    assert throttle_names((1 << 0) | (1 << 36)) == ("ppt0", "temp-hotspot")


def test_metrics_carry_the_sensors_of_the_sim_node(settings):
    from prometheus_client.parser import text_string_to_metric_families
    from gpuwarden.ops.metrics.collector import render
    from gpuwarden.ops.metrics.reading import Reading
    snap = sim_snapshot(settings)
    samples = {}
    for fam in text_string_to_metric_families(render(Reading(snapshot=snap, mode="oneshot", now=snap.taken_at)).decode()):
        for s in fam.samples:
            samples[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in ("gpu", "clock", "link",
                                                                                     "sensor", "block", "type"))))] = s.value
    assert samples[("gpuwarden_gpu_clock_max_hertz", (("clock", "sclk"), ("gpu", "0")))] == 2100e6
    assert samples[("gpuwarden_gpu_pcie_link_transfers_per_second", (("gpu", "0"), ("link", "max")))] == 32e9
    assert samples[("gpuwarden_gpu_sensor_temperature_celsius", (("gpu", "0"), ("sensor", "junction")))] > 0
    assert samples[("gpuwarden_gpu_ras_errors_total", (("block", "umc"), ("gpu", "0"), ("type", "ue")))] == 0
    assert samples[("gpuwarden_gpu_power_cap_watts", (("gpu", "0"),))] == 750
    assert not any(name == "gpuwarden_gpu_fan_rpm" for name, _ in samples)  # no fan: no series, not a 0


def test_gpu_detail_shows_every_sensor_and_na_for_the_missing(settings):
    from gpuwarden.ops.foundation.model import GpuSensors
    from gpuwarden.ops.foundation.records import replace
    from gpuwarden.tui.screens.gpu_detail import gpu_summary
    snap = sim_snapshot(settings)
    shown = gpu_summary(snap, 0).plain
    assert "sclk 500/2100 MHz" in shown and "mclk 900/1300 MHz" in shown and "memory busy 0%" in shown
    assert "of 750 W cap" in shown and "fan n/a" in shown
    assert "PCIe    32 GT/s x16 (max 32 GT/s x16)" in shown
    assert "edge 34C" in shown and "junction 43C" in shown and "memory 39C" in shown and "throttle n/a" in shown
    assert "corrected 0  uncorrected 0   retired pages 0 of threshold n/a" in shown
    # A link trained low, an uncorrected UMC error, throttling: all named.
    worn = GpuSensors(link_speed_gts=16.0, link_max_speed_gts=32.0, link_width=8, link_max_width=16,
                      throttle=("ppt0",), ras={"umc": {"ue": 2, "ce": 9}}, ecc_corrected=9, ecc_uncorrected=2,
                      retired_pages=3, pending_pages=1, bad_page_threshold=8)
    gpus = (replace(snap.gpus[0], sensors=worn),) + snap.gpus[1:]
    shown = gpu_summary(replace(snap, gpus=gpus), 0).plain
    assert "PCIe    16 GT/s x8 (max 32 GT/s x16)" in shown and "throttle ppt0" in shown
    assert "uncorrected 2 (umc ue 2)" in shown and "retired pages 3 (+1 pending) of threshold 8" in shown
    assert "clocks  sclk n/a" in shown and "temps   n/a" in shown


def test_agent_history_keeps_busy_power_temperature_and_clock_per_refresh(settings):
    from gpuwarden.ops.agent.history import History
    backend = SimBackend(settings, create=True)
    history = History(None, 1.0)
    try:
        history.add(take_snapshot(settings, backend))
        backend.node.allocate(os.getpid(), 0, 1 << 30)
        history.add(take_snapshot(settings, backend))
    finally:
        backend.node.free(os.getpid())
        backend.close()
    doc = history.document(gpu=0, resolution="fine")
    jsondoc.validate(doc)
    fine = doc["gpus"]["0"]["fine"]
    assert fine["busy_percent"] == [0, 12] and fine["sclk_mhz"] == [500, 1300]
    assert fine["power_mw"] == [90000, 150000] and fine["temperature_mc"] == [34000, 38000]
