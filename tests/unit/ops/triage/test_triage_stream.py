"""The streaming analyzer: the prefilter loses nothing, long lines are cut, memory stays bounded, no pattern
backtracks, and the live API reports what each line changed.
"""

from __future__ import annotations

import io
import time
import tracemalloc

from helpers.paths import REPO

from gpuwarden.ops.triage import analyze_file
from gpuwarden.ops.triage.analyze import MAX_FINDINGS, Analyzer
from gpuwarden.ops.triage.live import LiveTriage
from gpuwarden.ops.triage.logline import MAX_LINE
from gpuwarden.ops.triage.patterns import RULES
from gpuwarden.ops.triage.stream import HEAD_LINES, analyze_stream

CORPUS = REPO / "tests" / "triage_corpus"
QUIET = "[    1.000000] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n"


# A quiet GPU driver line that names a device: no rule literal, but the driver lines after it that name no
# device take its GPU (over DEVICE_CARRY lines), so skipping it must not change the report.
QUIET_GPU = "[    1.000000] amdgpu 0000:c1:00.0: amdgpu: ring comp_1.3.0 uses VM inv eng 5 on hub 0\n"
# A header with no rule literal whose indented continuation has one: the two are one message.
SPLIT_MESSAGE = "[  442366.409593] amdgpu:\n                 failed to send message 200 ret is 0\n"


def _whole_report(text: str):
    whole = Analyzer("log")
    for raw in text.split("\n")[:-1]:
        whole.feed(raw)
    return whole.finish()


def test_prefiltered_stream_reports_what_reading_every_line_reports(fixtures):
    logs = sorted(CORPUS.glob("*.log")) + sorted((fixtures / "dmesg").iterdir())
    # quiet lines first, so the prefilter (not the head that is read whole) decides about every real line; each
    # excerpt after a quiet GPU line and quiet chatter, `dmesg -H` excerpts (c06, c18, c20) among them
    text = QUIET * (HEAD_LINES + 50) + "".join(
        QUIET_GPU + QUIET * 3 + p.read_text(errors="replace").replace("\r", "") + "\n" + SPLIT_MESSAGE
        for p in logs)
    expected = _whole_report(text).to_dict()
    streamed = analyze_stream(io.BytesIO(text.encode()), source="log")
    assert streamed.to_dict() == expected
    # fed in odd-sized pushes (lines, and headers and their continuations, split across chunks): the same
    from gpuwarden.ops.triage.stream import StreamFeeder
    a = Analyzer("log")
    feeder = StreamFeeder(a)
    data = text.encode()
    for i in range(0, len(data), 997):
        feeder.push(data[i:i + 997])
    feeder.close()
    assert a.finish(lines=feeder.lines).to_dict() == expected
    # and the live watch, line by line, keeps the same findings
    live = LiveTriage("log")
    for raw in text.split("\n")[:-1]:
        live.feed(raw)
    assert [f.to_dict() for f in live.report().ordered()] == [
        f.to_dict() for f in _whole_report(text).ordered()]
    assert live.report().lines == expected["lines"]


def test_a_10_mb_line_is_cut_not_scanned(tmp_path):
    path = tmp_path / "huge.log"
    with open(path, "w") as f:
        f.write(QUIET)
        f.write("[    2.000000] amdgpu 0000:03:00.0: amdgpu: GPU reset begin! " + "x" * (10 << 20) + "\n")
        f.write("[    3.000000] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n")
        f.write("[    4.000000] " + "NVRM: GPU reset " * (1 << 20))  # and one with no newline at all
    t0 = time.process_time()
    r = analyze_file(path)
    took = time.process_time() - t0
    assert {"amdgpu.reset_begin", "nvidia.xid"} <= {f.rule for f in r.findings}
    assert r.lines == 4 and any("were cut" in n for n in r.notes)
    assert took < 10, f"{took:.1f}s CPU for 26 MB in 4 lines: something scans whole lines"


def test_no_rule_backtracks_on_long_adversarial_lines():
    """Every rule's own literal, and the characters its wildcards eat, repeated to the line limit.

    Patterns have bounded quantifiers only, so one line costs at most milliseconds; catastrophic backtracking
    would cost seconds to hours. The bound is loose because the machine is shared (best of three runs).
    """
    worst, which = 0.0, ""
    for rule in RULES:
        hint = rule.hint if isinstance(rule.hint, str) else (rule.hint or ("x",))[0]
        for filler in (hint + " ", hint + ": 0x1 (", "a" * 50 + hint, " pid 1 thread "):
            line = (filler * (MAX_LINE // len(filler) + 1))[:MAX_LINE]
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                rule.regex.search(line)
                for follow in rule.follow:
                    follow.search(line)
                best = min(best, time.perf_counter() - t0)
            if best > worst:
                worst, which = best, rule.id
    assert worst < 0.1, f"{which} took {worst * 1000:.0f} ms on one {MAX_LINE}-character line"


def test_memory_stays_bounded_with_endless_distinct_events():
    a = Analyzer("flood")
    tracemalloc.start()
    for i in range(3 * MAX_FINDINGS):
        a.feed(f"[{i}.000000] p{i}[{i}]: segfault at {i:x} ip {i:016x} sp 0 error 4\n")
        if i == MAX_FINDINGS:
            base = tracemalloc.get_traced_memory()[0]
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(a.findings) <= MAX_FINDINGS
    # past the cap, distinct events cost no memory (the repeated-message memo is itself capped)
    assert grown < 3 << 20, f"{grown} bytes more after {2 * MAX_FINDINGS} more distinct events"
    assert "were not kept" in " ".join(a.finish().notes)


def test_live_triage_reports_new_and_grown_findings():
    live = LiveTriage()
    lines = (CORPUS / "c01_amdgpu202_gfx12_ring_timeout_new_process_wording.log").read_text().splitlines()
    changed = {}
    for raw in lines:
        for f in live.feed(raw):
            changed.setdefault(f.rule, []).append((f.count, len(f.victims)))
    # the ring timeout came back twice: when it appeared, and when its process line named the culprit
    assert changed["amdgpu.ring_timeout"] == [(1, 0), (1, 1)]
    assert live.feed(QUIET) == []
    grown = live.feed_kmsg(b"3,1201,90096238,-;amdgpu 0000:45:00.0: amdgpu: GPU reset begin!\n SUBSYSTEM=pci")
    assert [(f.rule, f.count) for f in grown] == [("amdgpu.reset_begin", 2)]
    assert live.report().headline().startswith("ring gfx_0.0.0 timeout on 0000:45:00.0 (process glretrace[12755])")
    # a quiet line after the head is counted without being parsed, and a window still sees what follows
    for _ in range(HEAD_LINES):
        live.feed(QUIET)
    assert live.feed("[  99.1] amdgpu 0000:45:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:3 pasid:32769)")
    got = live.feed("[  99.2] amdgpu 0000:45:00.0: amdgpu:  Process glretrace pid 12755 thread glretrace:cs0 pid 12756")
    assert got and got[0].victims == [{"process": "glretrace", "pid": 12755, "thread": "glretrace:cs0"}]
    assert live.report().lines == len(lines) + 1 + 1 + HEAD_LINES + 2
