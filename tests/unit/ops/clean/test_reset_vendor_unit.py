"""The unit half of tests/integration/ops/clean/test_reset_vendor.py (its tests that need no process, socket or server); the pair's subject:
The vendor reset paths, proven by the exact command or library call they make (no real GPU is reset).

The amdsmi stand-in has the real call names and argument shapes of ROCm's py-interface/amdsmi_interface.py.
"""

from __future__ import annotations

import json

import pytest

from helpers.journal import read_journal
from gpuwarden.ops.clean import gpureset
from gpuwarden.ops.foundation.errors import BackendUnavailable, GpuwardenError
from gpuwarden.ops.clean.gpureset import Ran
from gpuwarden.ops.foundation.model import GpuInfo

AMD = GpuInfo(index=1, name="AMD Instinct MI300X", vendor="amd", bus_id="0000:c1:00.0", hive_id="0x1234")
NV = GpuInfo(index=3, name="NVIDIA H200", vendor="nvidia", bus_id="00000000:19:00.0")


class Recorder:
    def __init__(self, replies=None):
        self.calls: list[list[str]] = []
        self.replies = replies or {}

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        return self.replies.get(tuple(argv), Ran(0, "ok\n"))


class FakeAmdSmi:
    """Records calls; raises like the library (AmdSmiLibraryException with err_code) when told to."""

    class AmdSmiException(Exception):
        pass

    class AmdSmiLibraryException(AmdSmiException):
        def __init__(self, code):
            super().__init__(f"error code {code}")
            self.err_code = code

    class AmdSmiInitFlags:
        INIT_AMD_GPUS = "INIT_AMD_GPUS"

    class amdsmi_wrapper:
        AMDSMI_STATUS_NO_PERM = 10

    def __init__(self, fail_reset_code=None):
        self.calls = []
        self.fail_reset_code = fail_reset_code

    def amdsmi_init(self, flag):
        self.calls.append(("amdsmi_init", flag))

    def amdsmi_get_processor_handle_from_bdf(self, bdf):
        self.calls.append(("amdsmi_get_processor_handle_from_bdf", bdf))
        return f"handle:{bdf}"

    def amdsmi_reset_gpu(self, handle):
        self.calls.append(("amdsmi_reset_gpu", handle))
        if self.fail_reset_code is not None:
            raise self.AmdSmiLibraryException(self.fail_reset_code)

    def amdsmi_shut_down(self):
        self.calls.append(("amdsmi_shut_down",))


def no_amdsmi():
    raise BackendUnavailable("amdsmi: libamd_smi.so not found")


def which_only(*names):
    return lambda tool: f"/opt/rocm/bin/{tool}" if tool in names else None


def test_nvidia_uses_nvidia_smi_r_i_index(settings):
    path = gpureset.choose(NV, which=which_only("nvidia-smi"))
    run = Recorder()
    gpureset.perform(settings, path, runner=run)
    assert run.calls == [["nvidia-smi", "-r", "-i", "3"]]


def test_amd_prefers_the_amdsmi_library_call(settings):
    lib = FakeAmdSmi()
    path = gpureset.choose(AMD, which=which_only("amd-smi", "rocm-smi"), amdsmi_loader=lambda: lib)
    assert path.method == "amdsmi"
    run = Recorder()
    gpureset.perform(settings, path, runner=run, amdsmi_loader=lambda: lib)
    assert lib.calls == [("amdsmi_init", "INIT_AMD_GPUS"),
                         ("amdsmi_get_processor_handle_from_bdf", "0000:c1:00.0"),
                         ("amdsmi_reset_gpu", "handle:0000:c1:00.0"),
                         ("amdsmi_shut_down",)]
    assert run.calls == []  # no tool was run besides the library
    journal = read_journal(settings.state_dir)
    assert journal[-1]["action"] == "gpu-reset" and journal[-1]["method"] == "amdsmi"


def test_amdsmi_permission_failure_is_one_line_with_a_hint(settings):
    lib = FakeAmdSmi(fail_reset_code=FakeAmdSmi.amdsmi_wrapper.AMDSMI_STATUS_NO_PERM)
    path = gpureset.choose(AMD, amdsmi_loader=lambda: lib)
    with pytest.raises(GpuwardenError) as err:
        gpureset.perform(settings, path, amdsmi_loader=lambda: lib)
    assert "amdsmi_reset_gpu" in err.value.message and err.value.hint == "run as root"
    assert lib.calls[-1] == ("amdsmi_shut_down",)


def test_amd_falls_back_to_amd_smi_cli_by_bus_id(settings):
    path = gpureset.choose(AMD, which=which_only("amd-smi", "rocm-smi"), amdsmi_loader=no_amdsmi)
    run = Recorder()
    gpureset.perform(settings, path, runner=run)
    assert run.calls == [["amd-smi", "reset", "--gpureset", "-g", "0000:c1:00.0"]]


def test_amd_smi_failure_reported_in_output_with_exit_0_is_a_failure(settings):
    argv = ("amd-smi", "reset", "--gpureset", "-g", "0000:c1:00.0")
    run = Recorder({argv: Ran(0, "GPU: 1\n    GPU_RESET: Failed to reset GPU\n")})
    path = gpureset.choose(AMD, which=which_only("amd-smi"), amdsmi_loader=no_amdsmi)
    with pytest.raises(GpuwardenError) as err:
        gpureset.perform(settings, path, runner=run)
    assert "Failed to reset GPU" in err.value.message


def test_amd_falls_back_to_rocm_smi_with_its_own_index(settings):
    showbus = json.dumps({"card0": {"PCI Bus": "0000:0C:00.0"}, "card1": {"PCI Bus": "0000:22:00.0"},
                          "card2": {"PCI Bus": "0000:C1:00.0"}, "card3": {"PCI Bus": "0000:E1:00.0"}})
    run = Recorder({("rocm-smi", "--showbus", "--json"): Ran(0, showbus + "\n")})
    path = gpureset.choose(AMD, which=which_only("rocm-smi"), amdsmi_loader=no_amdsmi)
    gpureset.perform(settings, path, runner=run)
    # Our index 1 is rocm-smi's card2: the bus id decides, never the index.
    assert run.calls == [["rocm-smi", "--showbus", "--json"], ["rocm-smi", "--gpureset", "-d", "2"]]


def test_rocm_smi_without_the_gpu_refuses_rather_than_guess(settings):
    run = Recorder({("rocm-smi", "--showbus", "--json"): Ran(0, '{"card0": {"PCI Bus": "0000:0c:00.0"}}')})
    path = gpureset.choose(AMD, which=which_only("rocm-smi"), amdsmi_loader=no_amdsmi)
    with pytest.raises(GpuwardenError, match="does not list a GPU at 0000:c1:00.0"):
        gpureset.perform(settings, path, runner=run)
    assert run.calls == [["rocm-smi", "--showbus", "--json"]]


def test_no_tool_and_no_bus_id_are_clear_errors():
    with pytest.raises(GpuwardenError, match="neither the amdsmi library nor amd-smi nor rocm-smi"):
        gpureset.choose(AMD, which=which_only(), amdsmi_loader=no_amdsmi)
    with pytest.raises(GpuwardenError, match="bus id is unknown"):
        gpureset.choose(GpuInfo(index=0, name="x", vendor="amd"), amdsmi_loader=no_amdsmi)
    with pytest.raises(GpuwardenError, match="nvidia-smi is not on PATH"):
        gpureset.choose(NV, which=which_only())


def test_nonzero_exit_names_the_command(settings):
    run = Recorder({("nvidia-smi", "-r", "-i", "3"): Ran(1, "Unable to reset GPU: in use by another client\n")})
    path = gpureset.choose(NV, which=which_only("nvidia-smi"))
    with pytest.raises(GpuwardenError) as err:
        gpureset.perform(settings, path, runner=run)
    assert "`nvidia-smi -r -i 3` failed: Unable to reset GPU" in err.value.message
    journal = read_journal(settings.state_dir)
    assert journal[-1]["result"] == "failed"
