"""The unit half of tests/integration/ops/triage/test_triage_kfd_rank.py (its tests that need no process, socket or server); the pair's subject:
Triage ranks the KFD system-memory entry first with the node's numbers, or says which context it needs.

The arena incident as a bundle: four engines registered 25 GiB each of a 121.55 GiB limit, dp2's hipHostMalloc of
8 GiB failed 0.3 s before the first of four same-offset libamdhip64 segfaults, after KFD evict/restore lines.
"""

from __future__ import annotations

import json

from gpuwarden.ops.triage import kfdrank
from gpuwarden.ops.triage.bundle import triage_members
from helpers.kfd_log import T0, kernel_log, stamp

GiB = 1 << 30


def members(with_context: bool = True) -> dict[str, bytes]:
    out = {"kernel/kernel.log": kernel_log()}
    if not with_context:
        return out
    for i in range(4):
        regs = [{"kind": "register", "call": "hipHostRegister", "bytes": 25 * GiB, "outcome": "registered",
                 "started_at": T0 + i, "seconds": 0.5, "result": 0, "pid": 5000 + i}]
        if i == 2:
            regs.append({"kind": "alloc", "call": "hipHostMalloc", "bytes": 8 * GiB, "outcome": "failed",
                         "started_at": T0 + 9.7, "seconds": 0.0, "result": 2, "pid": 5002})
        state = {"name": f"dp{i}", "gpu": i, "phase": "crashed", "pid": 5000 + i, "signal": "SIGSEGV",
                 "died_while": "serving", "started_at": T0,
                 "phases": {"registered": T0 + i + 0.5, "serving": T0 + 5, "crashed": T0 + 10 + i * 0.3},
                 "registrations": regs}
        out[f"engines/dp{i}/state.json"] = json.dumps(state).encode()
        out[f"engines/dp{i}/spec.json"] = b"{}"
    out[kfdrank.KFD_LIMIT_MEMBER] = json.dumps({"used": None, "limit": int(121.546875 * GiB),
                                                "source": "computed"}).encode()
    return out


def test_the_storm_in_registering_engines_puts_the_kfd_entry_first_with_the_numbers():
    m = members()
    report = triage_members(m.get, [f"dp{i}" for i in range(4)], "bundle")
    first = report.known[0]
    assert first["id"] in (kfdrank.PINNED, kfdrank.SHARED), [k["id"] for k in report.known]
    assert first["id"] == kfdrank.PINNED  # the registrations fit: what crossed the limit is what else was pinned
    because = first["because"]
    assert "dp0-dp3 registered 4 x 25.0 GiB = 100.0 GiB of a 121.55 GiB limit" in because, because
    assert "dp2's hipHostMalloc of 8.0 GiB returned hipErrorOutOfMemory 0.3 s before the first crash" in because
    assert "confirm on this node" in because and "kfd/mem_limit" in because
    ids = [k["id"] for k in report.known]
    assert "hip-segfault-fatbinary-adddevprogram" not in ids[:2]
    doc = report.to_dict()
    assert doc["node_context"]["registered"]["dp1"] == 25 * GiB


def test_an_engine_that_served_on_still_counts_against_the_limit():
    """dp0 registered and did not crash (its next pinned allocation fitted once a peer's charges were freed): its
    registration was part of what the others met, so the numbers count all four, as the incident's operator would."""
    m = members()
    m["kernel/kernel.log"] = b"\n".join(line for line in kernel_log().splitlines() if b"dp0[" not in line) + b"\n"
    state = json.loads(m["engines/dp0/state.json"])
    state.update(phase="serving", signal=None, died_while=None)
    state["phases"].pop("crashed")
    m["engines/dp0/state.json"] = json.dumps(state).encode()
    report = triage_members(m.get, [f"dp{i}" for i in range(4)], "bundle")
    because = report.known[0]["because"]
    assert "dp0-dp3 registered 4 x 25.0 GiB = 100.0 GiB of a 121.55 GiB limit" in because, because


def test_without_context_the_report_says_what_it_needs_and_how_to_get_it():
    m = members(with_context=False)
    report = triage_members(m.get, [], "dmesg")
    note = next(n for n in report.notes if "KFD's system-memory limit" in n)
    assert "a gpuwarden bundle" in note and "sudo gpuwarden bundle" in note and "progress = \"preload\"" in note


def test_a_manual_bundle_labels_non_gpu_processes_as_other_and_never_leads_with_them():
    m = members()
    log = kernel_log().decode() + (f"{stamp(T0 + 20)} sshd[999]: segfault at 0 ip 0000555555554000 sp "
                                   "00007ffd00000000 error 4 in sshd[555555554000+1000] likely on CPU 0\n"
                                   f"{stamp(T0 + 21)} sshd[998]: segfault at 0 ip 0000555555554000 sp "
                                   "00007ffd00000000 error 4 in sshd[555555554000+1000] likely on CPU 0\n")
    m["kernel/kernel.log"] = log.encode()
    report = triage_members(m.get, [f"dp{i}" for i in range(4)], "bundle")
    sshd = next(f for f in report.findings if "sshd" in f.title)
    assert sshd.scope == "other-process" and "other processes on this host" in sshd.title
    assert "sshd" not in (report.headline() or "")


def test_engines_dying_together_are_one_finding_without_any_kernel_line():
    m = members()
    m["kernel/kernel.log"] = b""
    for i in range(4):  # no kernel line: the state files' crash times and exit statuses alone
        state = json.loads(m[f"engines/dp{i}/state.json"])
        state["phases"]["crashed"] = T0 + 10 + i * 0.37
        m[f"engines/dp{i}/state.json"] = json.dumps(state).encode()
    report = triage_members(m.get, [f"dp{i}" for i in range(4)], "bundle")
    (f,) = [f for f in report.findings if f.rule == "engine.died_together"]
    assert f.title == "4 engines died within 1.1 s: dp0 SIGSEGV, dp1 SIGSEGV, dp2 SIGSEGV, dp3 SIGSEGV", f.title
    assert report.known[0]["id"] == kfdrank.PINNED and "dp0-dp3 registered" in report.known[0]["because"]


def test_a_bundle_records_kfds_limit_computed_when_debugfs_is_not_readable(tmp_path, state_dir):
    from gpuwarden.ops.bundle.collectors import _kfd_limit
    from gpuwarden.ops.foundation.settings import Settings
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(f"MemTotal:       {125 * GiB // 1024} kB\n")
    got = _kfd_limit(Settings(state_dir=state_dir, proc_root=proc, sysfs_root=tmp_path / "sys", backend="fake"))
    assert got["source"] == "computed" and got["used"] is None and got["limit"] == int(121.546875 * GiB)
    assert "kfd/mem_limit" in got["where"]  # says which file it could not read


def test_the_svm_line_and_hips_cannot_create_memory_line_are_kfd_limit_findings_not_gpu_oom():
    from gpuwarden.ops.triage import analyze_text
    report = analyze_text(
        "[ 812.301] amdgpu: SVM mapping failed, exceeds resident system memory limit\n"
        ":1:hip_memory.cpp:257 : 9912 us: [pid:41 tid:0x7f] Cannot create memory for size: 26843545600 with "
        "flags: 3\n"
        "dp2: hipHostMalloc of 8.0 GiB returned hipErrorOutOfMemory\n")
    rules = {f.rule: f for f in report.findings}
    assert {"kfd.svm_mem_limit", "engine.hip_create_memory_failed", "engine.host_memory_failed"} <= set(rules)
    assert "engine.gpu_oom" not in rules  # pinned host memory is KFD's system-memory limit, not GPU memory
    assert "hipErrorInvalidValue" in rules["engine.hip_create_memory_failed"].meaning
    for f in (rules["kfd.svm_mem_limit"], rules["engine.host_memory_failed"]):
        assert "confirm on this node" in f.check and "kfd/mem_limit" in f.check


def test_an_engine_whose_fault_line_the_kernel_dropped_still_joins_the_storm():
    """The kernel prints 'segfault at' through printk_ratelimit(): in a storm a line can be missing. dp3 died of the
    same signal a moment after the others, with no line of its own: it is one of the storm, and the title says why it
    names no place."""
    m = members()
    m["kernel/kernel.log"] = b"\n".join(line for line in kernel_log().splitlines() if b"dp3[" not in line) + b"\n"
    report = triage_members(m.get, [f"dp{i}" for i in range(4)], "bundle")
    doc = report.to_dict()
    assert doc["headline"].startswith("4 engines died of SIGSEGV in libamdhip64.so.7 at offset 0xb71c9"), doc["headline"]
    assert "(1 of them without a fault line of its own: the kernel rate-limits them; 3 name the place)" \
        in doc["headline"], doc["headline"]
