"""The unit half of tests/integration/ops/triage/test_triage.py (its tests that need no process, socket or server); the pair's subject:
Triage on the captured kernel logs: every fixture yields the findings it contains, signatures group.

Logs come from tests/fixtures/dmesg (real pastes, see SOURCES.md); the CLI runs as a subprocess.
"""

from __future__ import annotations

import re

import pytest

from gpuwarden.ops.triage import analyze_file, analyze_text
from gpuwarden.ops.triage.logline import parse
from gpuwarden.ops.triage.render import markdown
from helpers.triage import EXPECTED

def test_every_fixture_log_is_covered(fixtures):
    assert sorted(p.name for p in (fixtures / "dmesg").iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_yields_its_findings(fixtures, name):
    report = analyze_file(fixtures / "dmesg" / name)
    found = {f.rule for f in report.findings}
    assert EXPECTED[name] <= found, f"missing {EXPECTED[name] - found}"
    # the markdown names every finding and never crashes on real data
    md = markdown(report)
    for f in report.findings:
        assert f.title in md


def _one(report, rule, **match):
    hits = [f for f in report.findings if f.rule == rule and all(f.details.get(k) == v for k, v in match.items())]
    assert len(hits) == 1, [f.title for f in report.findings if f.rule == rule]
    return hits[0]


def test_page_fault_names_process_pasid_and_client(fixtures):
    r = analyze_file(fixtures / "dmesg/rocm5616_gfx1103_darktable_gfxhub_pagefault_mes_gpu_reset_queue_evicted.log")
    f = _one(r, "amdgpu.page_fault")
    assert f.devices == ["0000:65:00.0"]
    assert f.victims == [{"process": "darktable", "pid": 70131, "thread": "worker 0"}]
    assert f.details["pasid"] == ["32787"] and f.details["utcl2_client"] == ["SQC (inst)"]
    # the older "in process ... pid" wording and UTCL2 client name
    r = analyze_file(fixtures / "dmesg/rocm5225_680m_gfxhub_pagefault_in_process_variant_utcl2.log")
    f = _one(r, "amdgpu.page_fault")
    assert f.count == 2 and f.victims[0]["process"] == "python3" and f.details["client_name"] == ["UTCL2"]


def test_reset_and_ring_timeout_details(fixtures):
    r = analyze_file(fixtures / "dmesg/rocm6313_bc250_gfx1013_journal_sdma0_ring_timeout_qcm_fence_kfd_restore_failed_mode1.log")
    ring = _one(r, "amdgpu.ring_timeout")
    assert "sdma0" in ring.title and ring.details["signaled"] == ["309"] and ring.details["emitted"] == ["313"]
    assert _one(r, "amdgpu.reset_begin").details["reset_source"] == ["4"]
    methods = {f.title.split()[0] for f in r.findings if f.rule == "amdgpu.reset_method"}
    assert methods == {"MODE1"}
    assert _one(r, "amdgpu.qcm_fence_timeout").count == 4
    # the syslog date uses a Czech month name: it is still a timestamp, not part of the message
    assert ring.first_stamp == "kvě 25 19:29:48"


def test_nvidia_xids_carry_number_meaning_and_process(fixtures):
    r = analyze_file(fixtures / "dmesg/nvidia_ctime_xid13_xid109_sm_warp_exception_ctx_switch_timeout.log")
    by_xid = {f.details["xid"]: f for f in r.findings if f.rule == "nvidia.xid"}
    assert set(by_xid) == {13, 109}
    assert by_xid[13].count == 3 and "Graphics engine exception" in by_xid[13].title
    assert by_xid[109].victims == [{"process": "pt_main_thread", "pid": 1797828}]
    assert "Context switch timeout" in by_xid[109].title
    r = analyze_file(fixtures / "dmesg/nvidia_xid31_13_32_gtx_dxvk.log")
    assert {f.details["xid"] for f in r.findings if f.rule == "nvidia.xid"} == {13, 31, 32}
    assert any("GPU-8a47641b" in n for n in r.notes)


def test_fallen_off_the_bus_spans_continuation_lines(fixtures):
    r = analyze_file(fixtures / "dmesg/nvidia_gpu_fallen_off_bus_no_xid_570.log")
    f = _one(r, "nvidia.fallen_off_bus")
    assert f.severity == "critical" and f.devices == ["0000:b3:00.0"]
    assert r.summary()[0].startswith("NVIDIA GPU 0000:b3:00.0 has fallen off the bus")


def test_xid_79_is_critical_with_its_meaning():
    # the Xid 79 line as NVIDIA's driver prints it (format of the Xid lines in the fixtures)
    r = analyze_text("[ 99.1] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n")
    f = _one(r, "nvidia.xid")
    assert f.severity == "critical" and "fallen off the bus" in f.title


def test_oom_victim_with_anon_rss(fixtures):
    r = analyze_file(fixtures / "dmesg/oom_killer_dmesg_time_format_iso_perl.log")
    f = _one(r, "oom.kill")
    v = f.victims[0]
    assert v["process"] == "perl" and v["pid"] == 1440763
    assert v["anon_rss"] == 60356340 * 1024 and v["constraint"] == "CONSTRAINT_NONE"
    assert f.first_stamp == "2024-04-29T14:55:41,679700+02:00"


def test_segfault_signature_uses_the_kernel_offset(fixtures):
    r = analyze_file(fixtures / "dmesg/rocm4189_rx570_segfault_libamdhip64.log")
    crashes = sorted((f for f in r.findings if f.rule == "userspace.crash"), key=lambda f: f.first_line)
    assert [f.signature for f in crashes] == ["libamdhip64.so.6.2.41134-65d174c3e+0x3ca89d",
                                              "libamdhip64.so.6.1.40093-bd86f1708+0x3b0f3d"]
    assert crashes[0].victims[0]["cpu"] == 10
    assert "user-mode read of an unmapped page (NULL pointer + 0x18)" in crashes[0].meaning


def _segv_line(fixtures) -> str:
    return (fixtures / "dmesg/rocm4189_rx570_segfault_libamdhip64.log").read_text().splitlines()[0]


def test_old_mapping_format_offset_is_ip_minus_base(fixtures):
    # the fixture line, rewritten to the pre-6.1 "[base+size]" mapping the kernel used to print
    line = re.sub(r"\[3ca89d,", "[", _segv_line(fixtures)).split(" likely on CPU")[0]
    r = analyze_text(line)
    f = _one(r, "userspace.crash")
    assert f.details["offset"] == hex(0x7782ccbca89d - 0x7782cc824000)


def test_four_processes_same_offset_are_one_finding_listed_first(fixtures):
    # four engines, each with libamdhip64 loaded at its own base, faulting at the same offset
    base_line = _segv_line(fixtures)
    lines = []
    for i, (pid, base) in enumerate([(4101, 0x7f0000000000), (4102, 0x7f1000000000), (4103, 0x7f2000000000),
                                     (4104, 0x7f3000000000)]):
        ip = base + 0x3A689D
        line = base_line.replace("a.out[3017]", f"engine{i}[{pid}]").replace("00007782ccbca89d", f"{ip:016x}")
        line = line.replace("7782cc824000", f"{base:x}").replace("segfault at 18", "segfault at 8")
        lines.append(line.replace("error 4", "error 6"))
    text = "\n".join(lines) + "\n[  870.1] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n"
    r = analyze_text(text)
    crashes = [f for f in r.findings if f.rule == "userspace.crash"]
    assert len(crashes) == 1
    f = crashes[0]
    assert sorted(v["pid"] for v in f.victims) == [4101, 4102, 4103, 4104]
    assert f.severity == "critical"
    assert r.summary()[0].startswith("4 processes crashed with the same signature: segfault in "
                                     "libamdhip64.so.6.2.41134-65d174c3e at offset 0x3ca89d")
    assert "user-mode write of an unmapped page (NULL pointer + 0x8)" in f.meaning


@pytest.mark.parametrize("raw,stamp,message", [
    ("[  867.972499] a.out[3017]: x", "867.972499", "a.out[3017]: x"),
    ("[Fri Aug 30 11:43:09 2024] NVRM: Xid", "Fri Aug 30 11:43:09 2024", "NVRM: Xid"),
    ("2024-04-29T14:55:41,678628+02:00 pool invoked", "2024-04-29T14:55:41,678628+02:00", "pool invoked"),
    ("kern  :err   : 2026-01-07T10:00:00,123456-06:00 boom", "2026-01-07T10:00:00,123456-06:00", "boom"),
    ("Oct  7 12:58:23 Ubuntu-Desktop kernel: [ 2237.944235] [drm] x", "Oct 7 12:58:23", "[drm] x"),
    ("kvě 25 19:29:48 bc250 kernel: amdgpu 0000:01:00.0: y", "kvě 25 19:29:48", "amdgpu 0000:01:00.0: y"),
    ("amdgpu 0000:04:00.0: amdgpu: MES", None, "amdgpu 0000:04:00.0: amdgpu: MES"),
])
def test_timestamp_formats(raw, stamp, message):
    line = parse(1, raw)
    assert line.stamp == stamp
    assert line.message == message
    assert parse(1, "kern  :err   : 2026-01-07T10:00:00,123456-06:00 boom").level == "err"
    assert parse(1, "2024-04-29T14:55:41,678628+02:00 x").wall == pytest.approx(1714395341.678628)


def test_timeline_orders_problems_by_first_appearance(fixtures):
    r = analyze_file(fixtures / "dmesg/rocm5616_gfx1103_darktable_gfxhub_pagefault_mes_gpu_reset_queue_evicted.log")
    md = markdown(r)
    timeline = md.split("## Timeline", 1)[1].split("##", 1)[0]
    order = [line for line in timeline.splitlines() if line.startswith("- ")]
    assert "GPU page fault" in order[0]  # the fault came first, the MES hang and the reset after it
    assert order.index(next(o for o in order if "MES firmware" in o)) < \
        order.index(next(o for o in order if "GPU reset began" in o))


def test_victims_that_were_engines_are_named(fixtures):
    line = (fixtures / "dmesg/rocm4189_rx570_segfault_libamdhip64.log").read_text().splitlines()[0]
    snapshot = {"engines": [{"name": "e0", "pid": 3017, "phase": "crashed"}], "residual": []}
    r = analyze_text(line, snapshot=snapshot)
    assert r.findings[0].victims[0]["engine"] == "e0"
    assert "engine=e0" in markdown(r)
