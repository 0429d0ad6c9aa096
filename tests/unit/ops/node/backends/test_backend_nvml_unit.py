"""The unit half of tests/integration/ops/node/backends/test_backend_nvml.py (its tests that need no process, socket or server); the pair's subject:
The NVML backend: one clear line without a driver (real: this machine has no libnvidia-ml), and the
struct-to-GpuInfo mapping through a stand-in pynvml replaying captured `nvidia-smi -q` reports.
"""

from __future__ import annotations

import ast
import csv
import re

import pynvml

import pytest

from gpuwarden.ops.node.backends import libload
from gpuwarden.ops.node.backends.nvml import SOURCE_UNKNOWN, NvmlBackend, bus_id
from gpuwarden.ops.foundation.errors import BackendUnavailable
from standins import pynvml_standin as standin
from standins.nvsmi_capture import MIB, parse_q, parse_query_csv
from helpers.paths import REPO

BACKEND_SRC = REPO / "ops/node/backends/nvml.py"
H100X8_Q = "nvidia/nvidia_smi_q_text_8x_h100_sxm_565.txt"
H100X8_TABLE = "nvidia/nvidia_smi_default_table_8x_h100_sxm_565.txt"
H100_LOAD_Q = "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt"
H100_LOAD_APPS = "nvidia/nvidia_smi_query_compute_apps_h100_80gb_hbm3_590.48.01_load.csv"
H200_MIG_GPU = "nvidia/nvidia_smi_query_gpu_all_fields_h200_mig_590.48.01_load.csv"
H200_MIG_APPS = "nvidia/nvidia_smi_query_compute_apps_h200_mig_590.48.01_load.csv"


@pytest.fixture
def open_replay(settings, tmp_path):
    opened = []
    settings = settings.with_(dev_root=tmp_path / "dev")

    def make(capture_path, **kw):
        mod = standin.build(parse_q(capture_path), **kw)
        backend = NvmlBackend(settings, module=mod)
        opened.append(backend)
        return backend, mod
    yield make
    for b in opened:
        b.close()


def test_without_a_driver_it_says_so_in_one_line(settings, capfd):
    libload.forget_failures()
    with pytest.raises(BackendUnavailable) as err:
        NvmlBackend(settings)  # the real pynvml: libnvidia-ml.so.1 is not on this machine
    assert err.value.message == "nvml: libnvidia-ml.so.1 not found (no NVIDIA driver)"
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("code, clause", [
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to open /dev/nvidia*"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
     "driver and libnvidia-ml versions differ (reload the driver or reboot)"),
    (pynvml.NVML_ERROR_UNKNOWN, "nvmlInit failed (Unknown Error)"),
])
def test_init_failures_become_one_clause(code, clause, settings, fixtures):
    mod = standin.build(parse_q(fixtures / H100X8_Q), init_error=code)
    with pytest.raises(BackendUnavailable) as err:
        NvmlBackend(settings, module=mod)
    assert err.value.message == f"nvml: {clause}"


def test_eight_h100_match_what_nvidia_smi_printed(open_replay, fixtures, tmp_path):
    backend, _ = open_replay(fixtures / H100X8_Q)
    gpus = backend.gpus()
    assert len(gpus) == 8 and {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert gpus[0].bus_id == "0000:18:00.0" and gpus[7].bus_id == "0000:db:00.0"
    assert gpus[0].uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert [g.device_files for g in gpus] == [(str(tmp_path / f"dev/nvidia{i}"),) for i in range(8)]
    assert gpus[0].power_w == pytest.approx(100.89) and gpus[0].temperature_c == 30.0
    assert all(g.vendor == "nvidia" and g.gtt_total is None and g.busy_percent == 0.0 for g in gpus)
    # The default table's Memory-Usage column ("1MiB /  81559MiB") is what `used` must equal.
    table = (fixtures / H100X8_TABLE).read_text()
    shown = [(int(u), int(t)) for u, t in re.findall(r"(\d+)MiB /\s+(\d+)MiB", table)]
    assert shown == [(g.vram_used // MIB, g.vram_total // MIB) for g in gpus]


def test_a_gpu_this_user_may_not_open_is_left_out_and_the_rest_keep_their_index(open_replay, fixtures):
    backend, _ = open_replay(fixtures / H100X8_Q, denied=frozenset({1}))
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 2, 3, 4, 5, 6, 7]
    assert gpus[1].bus_id == "0000:3a:00.0"  # NVML's (and nvidia-smi's) GPU 2


def test_no_gpu_may_be_opened(settings, fixtures):
    mod = standin.build(parse_q(fixtures / H100_LOAD_Q), denied=frozenset({0}))
    with pytest.raises(BackendUnavailable) as err:
        NvmlBackend(settings, module=mod)
    assert err.value.message == "nvml: no usable NVIDIA GPU: 1 found, none could be opened (Insufficient Permissions)"
    assert mod.calls.count("nvmlShutdown") == 1


def test_v1_memory_counts_the_reservation_as_used(open_replay, fixtures):
    backend, mod = open_replay(fixtures / H100X8_Q, memory_v2=False)
    gpus = backend.gpus()
    backend.gpus()
    # total - free = 81559 - 81106 MiB, i.e. Reserved 454 + Used 1 (each rounded by nvidia-smi): the
    # driver's reservation would read as a tenant's VRAM, which is why the v2 struct is asked first.
    assert gpus[0].vram_used == (81559 - 81106) * MIB and gpus[0].vram_total == 81559 * MIB
    v2_attempts = [c for c in mod.calls if c == "nvmlDeviceGetMemoryInfo"]
    assert len(v2_attempts) == 1 + 2 * 8  # one failed v2 call, then v1 for 8 GPUs in each refresh


def test_processes_under_load_match_compute_apps(open_replay, fixtures):
    backend, _ = open_replay(fixtures / H100_LOAD_Q)
    [gpu] = backend.gpus()
    assert gpu.vram_used == 19818 * MIB and gpu.busy_percent == 100.0
    assert gpu.power_w == pytest.approx(629.45) and gpu.temperature_c == 59.0
    usage = backend.process_usage()
    rows = list(csv.reader((fixtures / H100_LOAD_APPS).read_text().splitlines()[1:], skipinitialspace=True))
    expected = {int(r[5]): int(r[7].split()[0]) * MIB for r in rows}
    assert {u.pid: u.vram_bytes for u in usage} == expected
    assert {(u.gpu_index, u.source, u.gtt_bytes) for u in usage} == {(0, "nvml", None)}


def test_h200_in_mig_mode_without_utilisation_or_minor_number(settings, fixtures):
    gpus = parse_query_csv(fixtures / H200_MIG_GPU, fixtures / H200_MIG_APPS)
    backend = NvmlBackend(settings, module=standin.build(gpus))
    try:
        [gpu] = backend.gpus()
        usage = backend.process_usage()
    finally:
        backend.close()
    # MIG mode: utilization.gpu was [N/A] (NVML: NotSupported) -> None, and nothing else breaks
    assert gpu.busy_percent is None and gpu.name == "NVIDIA H200" and gpu.bus_id == "0000:83:00.0"
    assert gpu.vram_used == 16959 * MIB and gpu.vram_total == 143771 * MIB
    assert gpu.temperature_c == 36.0 and gpu.power_w == pytest.approx(295.01)
    assert gpu.device_files == ()  # the capture has no minor number: no guessed /dev/nvidiaN
    assert {u.pid: u.vram_bytes // MIB for u in usage} == {12249: 2194, 12250: 1170, 12267: 13526}


def test_standin_rejects_what_pynvml_rejects(fixtures):
    mod = standin.build(parse_q(fixtures / H100_LOAD_Q))
    mod.nvmlInit()
    handle = mod.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(standin.ContractViolation):
        mod.nvmlDeviceGetPowerUsage(handle, 0)  # wrong arity
    with pytest.raises(standin.ContractViolation):
        mod.nvmlDeviceGetPowerUsage(0)  # an index where a handle belongs
    with pytest.raises(pynvml.NVMLError_NotSupported):
        mod.nvmlDeviceGetFanSpeed(handle)  # real signature, nothing captured: NotSupported


def test_old_driver_without_v3_process_lists_falls_back_to_v2(open_replay, fixtures):
    backend, mod = open_replay(fixtures / H100_LOAD_Q, process_v3=False)
    first = backend.process_usage()
    second = backend.process_usage()
    assert sorted(u.pid for u in first) == sorted(u.pid for u in second) == [11327, 11328, 11345]
    # the unversioned lister is tried once per GPU and kind, then only _v2 is called
    assert mod.calls.count("nvmlDeviceGetComputeRunningProcesses") == 1
    assert mod.calls.count("nvmlDeviceGetComputeRunningProcesses_v2") == 2


def test_memory_not_permitted_is_marked_unknown_not_zero_evidence(open_replay, fixtures):
    backend, _ = open_replay(fixtures / H100_LOAD_Q, process_memory=False)
    usage = backend.process_usage()
    assert sorted(u.pid for u in usage) == [11327, 11328, 11345]
    assert {(u.vram_bytes, u.source) for u in usage} == {(0, SOURCE_UNKNOWN)}


def test_a_compute_and_graphics_process_is_counted_once(settings, fixtures):
    gpus = parse_q(fixtures / H100_LOAD_Q)
    gpus[0].processes[0].kind = "C+G"  # the same PID in both NVML lists, as nvidia-smi's "C+G" rows are
    backend = NvmlBackend(settings, module=standin.build(gpus))
    try:
        usage = backend.process_usage()
    finally:
        backend.close()
    assert [u.pid for u in usage].count(11327) == 1
    assert next(u for u in usage if u.pid == 11327).vram_bytes == 2566 * MIB


def test_close_shuts_nvml_down_once(open_replay, fixtures):
    backend, mod = open_replay(fixtures / H100_LOAD_Q)
    backend.close()
    backend.close()
    assert mod.calls.count("nvmlShutdown") == 1


def test_device_globs(open_replay, fixtures, tmp_path):
    backend, _ = open_replay(fixtures / H100_LOAD_Q)
    assert backend.device_globs() == [str(tmp_path / "dev/nvidia[0-9]*"), str(tmp_path / "dev/nvidiactl"),
                                      str(tmp_path / "dev/nvidia-uvm")]


@pytest.mark.parametrize("raw, expected", [
    ("00000000:18:00.0", "0000:18:00.0"), ("00000000:DB:00.0", "0000:db:00.0"),
    ("00000001:0A:1F.7", "0001:0a:1f.7"), (None, None), ("", None),
])
def test_bus_id_spelling(raw, expected):
    assert bus_id(raw) == expected


def test_every_nvml_name_the_backend_uses_exists_in_pynvml():
    tree = ast.parse(BACKEND_SRC.read_text())
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("nvml")}
    names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
              and re.fullmatch(r"(nvml\w+|NVML\w+)", n.value)}
    assert "nvmlDeviceGetMemoryInfo" in names, "the AST scan found nothing: the test is broken"
    missing = sorted(n for n in names if not hasattr(pynvml, n))
    assert not missing, missing


def test_a_query_the_device_does_not_support_is_asked_once(settings, fixtures):
    # H200 in MIG mode: no fan (passively cooled) and no utilisation; every refresh asked both again, and the
    # error path of the fan query alone was a sixth of the console's CPU on a real H200.
    gpus = parse_query_csv(fixtures / H200_MIG_GPU, fixtures / H200_MIG_APPS)
    mod = standin.build(gpus)
    backend = NvmlBackend(settings, module=mod)
    try:
        for _ in range(4):
            [gpu] = backend.gpus()
    finally:
        backend.close()
    assert gpu.busy_percent is None and gpu.sensors.fan_percent is None and gpu.power_w == pytest.approx(295.01)
    assert mod.calls.count("nvmlDeviceGetFanSpeed") == 1
    assert mod.calls.count("nvmlDeviceGetUtilizationRates") == 1
    assert mod.calls.count("nvmlDeviceGetPowerUsage") == 4  # what answers is asked on every refresh


def test_the_not_supported_memory_knows_real_handles_which_do_not_hash(settings, fixtures):
    # pynvml's handles are ctypes pointers (unhashable): the first version of the memory keyed calls by their
    # arguments' hash, skipped every real handle and so never remembered anything on the H200.
    backend = NvmlBackend(settings, module=standin.build(parse_q(fixtures / H100_LOAD_Q)))
    calls = []

    def fan(handle):
        calls.append(handle)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    try:
        handle = pynvml.c_nvmlDevice_t()
        with pytest.raises(TypeError):
            hash(handle)
        assert [backend._try(fan, handle) for _ in range(3)] == [None, None, None]
        assert len(calls) == 1
        other = pynvml.c_nvmlDevice_t()
        assert backend._try(fan, other) is None and len(calls) == 2  # another device is asked for itself
    finally:
        backend.close()


def _dear(mod, cpu_s: float):
    """The stand-in's nvmlDeviceGetProcessUtilization made to burn `cpu_s` of the calling thread's CPU first, as
    the real call does (1.5 ms an H100 with a process, tests/device/nvml_call_cost.py); returns its call count."""
    import time
    answer, calls = mod.nvmlDeviceGetProcessUtilization, []

    def dear(handle, timeStamp):
        calls.append(timeStamp)
        until = time.thread_time() + cpu_s
        while time.thread_time() < until:
            pass
        return answer(handle, timeStamp)
    dear.__name__ = "nvmlDeviceGetProcessUtilization"
    mod.nvmlDeviceGetProcessUtilization = dear
    return calls


def test_a_dear_process_utilisation_call_is_asked_less_often_until_the_processes_change(settings, tmp_path, fixtures):
    from gpuwarden.ops.node.backends import nvml
    gpus = parse_q(fixtures / H100_LOAD_Q)
    pid = gpus[0].processes[0].pid
    mod = standin.build(gpus, utilisation={0: [(pid, 10, 50, 5, 0, 0)]})
    backend = NvmlBackend(settings.with_(dev_root=tmp_path / "dev"), module=mod)
    calls = _dear(mod, 0.002)
    backend.process_usage()
    first = backend.process_utilisation()
    assert first is not None and first[0][pid] == (50, 5, 0, 0) and len(calls) == 1
    # 2 ms of CPU a pass: asked again only after 2 ms / UTIL_SHARE, at most UTIL_MAX_EVERY_S later.
    assert backend.util_every_s == pytest.approx(min(nvml.UTIL_MAX_EVERY_S, 0.002 / nvml.UTIL_SHARE), rel=0.5)
    backend.process_usage()
    assert backend.process_utilisation() is first and len(calls) == 1
    # A process gone from the lists: its GPU is asked again at once, not after the interval.
    gpus[0].processes.pop(0)
    backend.process_usage()
    backend.process_utilisation()
    assert len(calls) == 2
    backend.close()


def test_a_cheap_process_utilisation_call_is_asked_every_refresh(open_replay, fixtures):
    pid = parse_q(fixtures / H100_LOAD_Q)[0].processes[0].pid
    backend, mod = open_replay(fixtures / H100_LOAD_Q, utilisation={0: [(pid, 10, 50, 5, 0, 0)]})
    calls = _dear(mod, 0.0)
    for _ in range(3):
        backend.process_usage()
        backend.process_utilisation()
    assert len(calls) == 3 and backend.util_every_s == 0.0


def test_while_nobody_reads_it_a_dear_call_waits_the_quiet_interval(settings, tmp_path, fixtures, monkeypatch):
    from gpuwarden.ops.node.backends import nvml

    class Clock:
        now = 1000.0

        def monotonic(self) -> float:
            return self.now

        def thread_time(self) -> float:
            import time
            return time.thread_time()  # the call's cost is still measured for real
    clock = Clock()
    monkeypatch.setattr(nvml, "time", clock)
    gpus = parse_q(fixtures / H100_LOAD_Q)
    pid = gpus[0].processes[0].pid
    mod = standin.build(gpus, utilisation={0: [(pid, 10, 50, 5, 0, 0)]})
    backend = NvmlBackend(settings.with_(dev_root=tmp_path / "dev"), module=mod)
    calls = _dear(mod, 0.002)
    try:
        backend.process_usage()
        backend.process_utilisation()
        assert len(calls) == 1 and backend.util_every_s > 0
        backend.util_quiet = True
        clock.now += nvml.UTIL_MAX_EVERY_S + 1  # due at the usual cadence, not while quiet
        backend.process_utilisation()
        assert len(calls) == 1
        clock.now += nvml.UTIL_QUIET_EVERY_S - nvml.UTIL_MAX_EVERY_S
        backend.process_utilisation()
        assert len(calls) == 2
        # A process that comes or goes is asked about at once, quiet or not.
        gpus[0].processes.pop(0)
        backend.process_usage()
        backend.process_utilisation()
        assert len(calls) == 3
        # A reader again: the usual cadence from the next refresh on.
        backend.util_quiet = False
        clock.now += nvml.UTIL_MAX_EVERY_S + 0.01
        backend.process_utilisation()
        assert len(calls) == 4
    finally:
        backend.close()


def test_the_process_lists_come_with_each_gpus_lane_job_and_repeat_as_the_same_objects(settings, tmp_path, fixtures):
    gpus = parse_q(fixtures / H100_LOAD_Q)
    backend = NvmlBackend(settings.with_(dev_root=tmp_path / "dev"), module=standin.build(gpus))
    handed: list[object] = []
    latest = backend._lanes.latest

    def counted(*args, **kw):
        handed.append(args[0])
        return latest(*args, **kw)
    backend._lanes.latest = counted
    try:
        backend.gpus()
        first = backend.process_usage()
        assert first and handed == []  # read in the GPUs' own lane jobs: no second hand-off
        assert backend.process_usage() == first and len(handed) == 1  # lists are used once; then the lane
        backend.gpus()
        again = backend.process_usage()
        assert len(handed) == 1 and len(again) == len(first) and all(a is b for a, b in zip(again, first))
        # A figure that moved is a new object; the other GPUs' lists stay the very same.
        gpus[0].processes[0].used_mib += 1
        backend.gpus()
        moved = backend.process_usage()
        changed = [(a, b) for a, b in zip(moved, first) if a is not b]
        assert changed and all(a.gpu_index == 0 for a, _ in changed)
        assert any(a.vram_bytes != b.vram_bytes for a, b in changed)
    finally:
        backend.close()


def test_a_gpu_with_one_process_gives_it_the_gpus_own_figures_without_the_dear_call(settings, tmp_path, fixtures):
    gpus = parse_q(fixtures / H100_LOAD_Q)
    first, second = gpus[0].processes[:2]
    gpus[0].processes[:] = [first]
    # What the dear call would say differs, so an answer from it would show.
    mod = standin.build(gpus, utilisation={0: [(first.pid, 10, 99, 9, 0, 0), (second.pid, 10, 1, 1, 0, 0)]})
    backend = NvmlBackend(settings.with_(dev_root=tmp_path / "dev"), module=mod)
    calls = _dear(mod, 0.002)
    try:
        for busy in (37, 64):
            gpus[0].fields["Utilization.GPU"] = f"{busy} %"
            gpu = backend.gpus()[0]
            backend.process_usage()
            loads = backend.process_utilisation()
            assert gpu.busy_percent == busy
            assert loads is not None and loads[0] == {first.pid: (busy, int(gpu.sensors.mem_busy_percent), 0, 0)}
        assert calls == []  # fresh each refresh, and never the 2 ms call
        # A second process on it: whose kernels ran is no longer the GPU's to say, so the dear call says it.
        gpus[0].processes.append(second)
        backend.gpus()
        backend.process_usage()
        loads = backend.process_utilisation()
        assert loads is not None and loads[0] == {first.pid: (99, 9, 0, 0), second.pid: (1, 1, 0, 0)}
        assert len(calls) == 1
    finally:
        backend.close()


def test_a_sole_process_s_video_coder_figures_are_asked_every_medium_refreshes(settings, tmp_path, fixtures):
    from gpuwarden.ops.node.backends.nvml_sensors import MEDIUM_EVERY
    gpus = parse_q(fixtures / H100_LOAD_Q)
    first = gpus[0].processes[0]
    gpus[0].processes[:] = [first]
    gpus[0].fields["Utilization.Encoder"], gpus[0].fields["Utilization.Decoder"] = "12 %", "3 %"
    mod = standin.build(gpus, utilisation={0: []})
    backend = NvmlBackend(settings.with_(dev_root=tmp_path / "dev"), module=mod)
    try:
        for _ in range(MEDIUM_EVERY):
            backend.gpus()
            backend.process_usage()
            loads = backend.process_utilisation()
            assert loads is not None and loads[0][first.pid][2:] == (12, 3)  # kept between the asks
        assert mod.calls.count("nvmlDeviceGetEncoderUtilization") == 1
        assert mod.calls.count("nvmlDeviceGetDecoderUtilization") == 1
        gpus[0].fields["Utilization.Encoder"] = "40 %"
        backend.gpus()
        backend.process_usage()
        assert backend.process_utilisation()[0][first.pid][2] == 40  # the next medium refresh asks again
    finally:
        backend.close()
