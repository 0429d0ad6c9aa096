"""NVML's sized queries asked once into a kept array (ops/node/backends/nvml_sized.py): one C call a list a
refresh where nvidia-ml-py's wrappers make two, the same answers as those wrappers, and a grown array."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwarden.ops.node.backends import nvml_sized
from gpuwarden.ops.node.backends.nvml import SOURCE_UNKNOWN, NvmlBackend
from standins import pynvml_standin as standin
from standins.nvsmi_capture import parse_q

H100_LOAD_Q = "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt"
LIST = "nvmlDeviceGetComputeRunningProcesses"


@pytest.fixture
def node(settings, tmp_path, fixtures):
    opened = []

    def make(gpus=None, **kw):
        gpus = gpus if gpus is not None else parse_q(fixtures / H100_LOAD_Q)
        mod = standin.build(gpus, **kw)
        backend = NvmlBackend(settings.with_(dev_root=tmp_path / "dev"), module=mod)
        opened.append(backend)
        return backend, mod, gpus
    yield make
    for b in opened:
        b.close()


def refresh(backend):
    backend.gpus()
    return backend.process_usage()


def test_each_list_is_one_c_call_a_refresh_into_the_kept_array(node):
    backend, mod, gpus = node()
    assert backend._sized is not None
    for _ in range(3):
        usage = refresh(backend)
    assert sorted(u.pid for u in usage) == sorted(p.pid for p in gpus[0].processes)
    assert mod.calls.count(LIST + "_v3") == 3 * len(gpus)  # once a refresh a GPU, and never the wrapper
    assert mod.calls.count(LIST) == 0


def test_more_processes_than_the_array_holds_grow_it_once(node, fixtures):
    gpus = parse_q(fixtures / H100_LOAD_Q)
    template = gpus[0].processes[0]
    many = nvml_sized.FIRST_SIZE + 9
    gpus[0].processes[:] = [dataclasses.replace(template, pid=50_000 + i) for i in range(many)]
    backend, mod, _ = node(gpus)
    first = refresh(backend)
    asked = mod.calls.count(LIST + "_v3")
    second = refresh(backend)
    assert sorted(u.pid for u in first) == sorted(u.pid for u in second) == [50_000 + i for i in range(many)]
    assert mod.calls.count(LIST + "_v3") - asked == len(gpus)  # the grown array held them all the next time
    assert asked == len(gpus) + 1  # GPU 0 asked twice the first time: to learn the size, then to fill


@pytest.mark.parametrize("c_functions", [True, False], ids=["sized", "wrappers"])
def test_the_sized_calls_answer_as_the_wrappers_do(node, fixtures, c_functions):
    gpus = parse_q(fixtures / H100_LOAD_Q)
    pids = [p.pid for p in gpus[0].processes]
    samples = {0: [(pids[0], 10, 40, 4, 0, 0), (pids[0], 20, 55, 6, 1, 2), (pids[1], 15, 7, 1, 0, 0)]}
    backend, mod, _ = node(gpus, utilisation=samples, c_functions=c_functions, process_memory=False)
    assert (backend._sized is not None) == c_functions
    usage = refresh(backend)
    assert sorted(u.pid for u in usage) == sorted(pids)
    assert {(u.vram_bytes, u.source) for u in usage} == {(0, SOURCE_UNKNOWN)}  # NVML's "not available"
    loads = backend.process_utilisation()
    assert loads is not None and loads[0] == {pids[0]: (55, 6, 1, 2), pids[1]: (7, 1, 0, 0)}  # each one's newest
    # Nothing newer than the newest sample seen: NVML's NOT_FOUND, which reads as "nothing ran".
    backend._util_next = 0.0
    backend.util_every_s = 0.0
    assert backend.process_utilisation() == {i: {} for i in range(len(gpus))}
    assert mod.calls.count("nvmlDeviceGetProcessUtilization") == 2


def test_a_gpu_that_cannot_say_still_reads_as_none(node):
    backend, mod, _ = node()  # no utilisation in the capture: NOT_SUPPORTED, through the C call too
    refresh(backend)
    assert backend._sized is not None and backend.process_utilisation() is None
