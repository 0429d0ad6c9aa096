"""The unit half of tests/integration/ops/triage/test_triage_engines.py (its tests that need no process, socket or server); the pair's subject:
Engine-side triage: what a crashed engine died of, from a real bundle of real crashes, and from engine logs.

The storm test is the arena incident in miniature: four supervised engines register, then fault together
in one shared library at one offset; the kernel logs the segfaults, the cores are real, the bundle is made
by the real CLI and `triage` must say first: 4 engines died of SIGSEGV in that library at that offset.
"""

from __future__ import annotations

import json
import time

import pytest

from engines.harness import records, supervised  # noqa: F401

from gpuwarden.ops.triage import analyze_text
from gpuwarden.ops.triage.engine import TRACEBACK_RULE


def test_python_traceback_names_exception_and_last_frame():
    log = "\n".join([
        "INFO 09-01 12:00:00 [core.py:100] starting",
        "(EngineCore_DP0 pid=4242) ERROR 09-01 12:00:05 [core.py:588] Traceback (most recent call last):",
        '(EngineCore_DP0 pid=4242) ERROR 09-01 12:00:05 [core.py:588]   File "/srv/vllm/engine/core.py", line 579, '
        "in run_engine_core",
        "(EngineCore_DP0 pid=4242) ERROR 09-01 12:00:05 [core.py:588]     engine_core.run_busy_loop()",
        '(EngineCore_DP0 pid=4242) ERROR 09-01 12:00:05 [core.py:588]   File "/srv/vllm/worker/model_runner.py", '
        "line 1204, in execute_model",
        "(EngineCore_DP0 pid=4242) ERROR 09-01 12:00:05 [core.py:588]     hidden = self.model(**inputs)",
        "(EngineCore_DP0 pid=4242) ERROR 09-01 12:00:05 [core.py:588] torch.OutOfMemoryError: HIP out of memory. "
        "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB",
    ])
    r = analyze_text(log)
    exc = next(f for f in r.findings if f.rule == TRACEBACK_RULE.id)
    assert exc.details["exception"] == "torch.OutOfMemoryError"
    assert exc.details["last_frame"] == {"file": "/srv/vllm/worker/model_runner.py", "line": 1204,
                                         "func": "execute_model"}
    assert "model_runner.py:1204 in execute_model" in exc.title
    oom = next(f for f in r.findings if f.rule == "engine.gpu_oom")
    assert "2.00 GiB" in oom.title
    assert r.exit_code() == 1


@pytest.mark.parametrize("line,rule,words", [
    ("RuntimeError: HIP error: an illegal memory access was encountered", "engine.hip_error", "illegal memory"),
    ("hipErrorNoBinaryForGpu: Unable to find code object for all current devices!", "engine.hip_error",
     "hipErrorNoBinaryForGpu"),
    ("Memory access fault by GPU node-2 (Agent handle: 0x55d0c4e4bd00) on address 0x7f1c3e000000. "
     "Reason: Page not present or supervisor privilege.", "hsa.memory_access_fault", "node-2"),
    ("terminate called after throwing an instance of 'c10::Error'", "engine.cpp_terminate", "c10::Error"),
    ("HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond the largest legal "
     "address.", "engine.hsa_error", "APERTURE"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "engine.cuda_error", "illegal memory"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
     "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5 ncclUnhandledCudaError",
     "engine.nccl_error", "ncclUnhandledCudaError"),
    ("[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=8, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600042 milliseconds "
     "before timing out.", "engine.nccl_timeout", "600042 ms"),
    ("Fatal Python error: Segmentation fault", "engine.fatal_signal", "Segmentation fault"),
])
def test_runtime_error_lines(line, rule, words):
    r = analyze_text(line)
    hit = [f for f in r.findings if f.rule == rule]
    assert hit and words in hit[0].title, [f.title for f in r.findings]


def _incident_members(t0: float) -> dict[str, bytes]:
    """A bundle's members after dp3's failed registration and crash, the host's kernel log carrying seven faults of
    unrelated processes (other tests' stand-ins) and a GPU fault an hour before dp3 started."""
    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f",{int((t % 1) * 1e6):06d}+00:00"
    lines = [f"{stamp(t0 - 3600)} amdgpu 0000:c1:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:3 "
             "pasid:32770)"]
    for i, name in enumerate(["engine_dlopen", "engine_linked", "python"] * 2 + ["python"]):
        lines.append(f"{stamp(t0 + 1 + i * 0.1)} {name}[{5000 + i}]: segfault at 8 ip 00007f1c1d3bd5d4 sp "
                     f"00007fff64729c30 error 6 in libamdhip64.so[15d4,7f1c1d3bd000+1000] likely on CPU 1 "
                     "(core 1, socket 0)")
    lines.append(f"{stamp(t0 + 3.45)} hipworker[777]: segfault at 0 ip 00007f2a000b71c9 sp 00007ffd1c0e2a10 error 4 "
                 "in libamdhip64.so.7[b71c9,7f2a00000000+3a0000] likely on CPU 3 (core 3, socket 0)")
    state = {"name": "dp3", "gpu": 3, "phase": "crashed", "pid": 777, "signal": "SIGSEGV", "core_dumped": False,
             "started_at": t0, "died_while": "failed-registration",
             "phases": {"starting": t0, "registering": t0 + 3.0, "failed-registration": t0 + 3.1, "crashed": t0 + 3.5},
             "registrations": [{"kind": "register", "call": "hipHostRegister", "bytes": 64 << 30, "outcome": "failed",
                                "started_at": t0 + 3.0, "seconds": 0.1, "result": 2, "pid": 777, "via": "symbol"}]}
    return {"kernel/kernel.log": ("\n".join(lines) + "\n").encode(),
            "engines/dp3/state.json": json.dumps(state).encode(), "engines/dp3/spec.json": b"{}"}


def test_a_bundle_for_an_engine_leads_with_its_failed_registration_and_labels_other_processes():
    from gpuwarden.ops.triage.bundle import triage_members
    from gpuwarden.ops.triage.registration import clock
    t0 = 1796126400.0
    members = _incident_members(t0)
    report = triage_members(members.get, ["dp3"], "bundle", {"engine": "dp3", "reason": "engine dp3 killed by SIGSEGV"})
    want = (f"dp3: hipHostRegister of 64.0 GiB returned hipErrorOutOfMemory at {clock(t0 + 3.1)}; SIGSEGV in "
            "libamdhip64.so.7 at 0xb71c9 0.4 s later: the engine used a buffer it failed to register")
    assert report.headline() == want
    ordered = report.ordered()
    assert [f.scope for f in ordered] == ["subject", "window", "outside", "other-process"], \
        [(f.scope, f.title) for f in ordered]
    others = ordered[-1]
    assert others.title.startswith("other processes on this host, not dp3 nor another engine of this bundle: "
                                   "7 processes crashed with the same signature: segfault in libamdhip64.so")
    assert others.severity == "warning" and others.details["severity_as_found"] == "critical"
    assert ordered[2].title.endswith("(outside dp3's run)")
    assert report.subject["engine"] == "dp3" and report.subject["window"][0] < t0 < report.subject["window"][1]
    # Without knowing whom the bundle is for, the crash that followed a failed registration still leads.
    plain = triage_members(members.get, ["dp3"], "bundle")
    assert plain.headline() == want and plain.subject is None


def test_a_running_engine_whose_registration_failed_is_a_finding():
    from gpuwarden.ops.triage.bundle import triage_members
    t0 = 1796126400.0
    members = _incident_members(t0)
    state = json.loads(members["engines/dp3/state.json"])
    state.update(phase="failed-registration", signal=None, died_while=None)
    state["phases"].pop("crashed")
    members = {"engines/dp3/state.json": json.dumps(state).encode(), "engines/dp3/spec.json": b"{}"}
    report = triage_members(members.get, ["dp3"], "bundle", {"engine": "dp3"})
    (f,) = [f for f in report.findings if f.rule == "engine.register_failed"]
    assert f.scope == "subject" and f.severity == "error"
    assert report.headline().startswith("dp3: hipHostRegister of 64.0 GiB returned hipErrorOutOfMemory at ")
    assert report.headline().endswith("; the engine runs on without that memory registered")
