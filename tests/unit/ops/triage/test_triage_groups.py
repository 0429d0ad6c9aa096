"""A storm (every corpus incident on eight GPUs, addresses fresh) triaged into a page: grouped summary lines
with counts and stamps, at most 30 of them, and a Markdown report under 256 KiB with every finding in --json."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from gpuwarden.ops.triage import analyze_file
from gpuwarden.ops.triage.groups import SUMMARY_MAX, group
from gpuwarden.ops.triage.render import REPORT_MAX, as_json, markdown
from helpers.paths import TESTS

ROOT = TESTS
GPUS = [f"0000:{b:02x}:00.0" for b in (0x0c, 0x1c, 0x3c, 0x5c, 0x8c, 0x9c, 0xbc, 0xdc)]
_DEV = re.compile(r"\b[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]\b")
_HEX = re.compile(r"0x[0-9a-fA-F]{6,}")


def _storm(path: Path, rounds: int = 3) -> None:
    rnd = random.Random(38)
    logs = sorted((ROOT / "triage_corpus").glob("*.log")) + sorted((ROOT / "fixtures" / "dmesg").iterdir())
    texts = [p.read_text(errors="replace") for p in logs]
    t = 1000.0
    with path.open("w") as out:
        for _ in range(rounds):
            for gpu in GPUS:
                for text in texts:
                    text = _DEV.sub(gpu, text)
                    text = _HEX.sub(lambda m: f"0x{rnd.getrandbits(40):010x}", text)
                    out.write(text if text.endswith("\n") else text + "\n")
                # one failure the same on every GPU: eight findings, one summary line
                t += 1
                out.write(f"[{t:12.6f}] amdgpu {gpu}: amdgpu: hw_init of IP block <gfx_v11_0> failed -110\n")


def test_storm_summary_is_a_page_and_the_report_is_bounded(tmp_path):
    log = tmp_path / "storm.log"
    _storm(log)
    report = analyze_file(log)
    assert len(report.findings) > 200  # a storm: far more findings than a page holds
    summary = report.summary()
    assert len(summary) <= SUMMARY_MAX
    assert summary[-1].startswith("... and ") and "more groups" in summary[-1]
    md = markdown(report)
    assert len(md.encode()) <= REPORT_MAX
    assert "more findings not shown" in md
    doc = json.loads(as_json(report))
    assert len(doc["findings"]) == len(report.findings)  # --json keeps every one
    assert len(doc["summary"]) <= SUMMARY_MAX


def test_same_failure_on_eight_gpus_is_one_group_with_total_count_and_stamps(tmp_path):
    log = tmp_path / "storm.log"
    _storm(log)
    report = analyze_file(log)
    hw = [f for f in report.findings if "gfx_v11_0" in f.title and f.severity != "info"]
    assert len(hw) >= 1
    groups = [g for g in group(report.ordered()) if "gfx_v11_0" in g.key]
    assert len(groups) == 1, [g.key for g in groups]
    g = groups[0]
    assert sorted(g.devices) == sorted(GPUS) or len(g.members) == len(hw)
    assert g.count == sum(f.count for f in hw) == 3 * len(GPUS)
    line = g.line()
    assert f"x{g.count}" in line
    if len(g.members) > 1:
        assert "8 devices" in line and "1001.000000" in line and f"{1000 + 3 * len(GPUS):.6f}" in line


def test_a_lone_finding_reads_as_before(tmp_path):
    log = tmp_path / "one.log"
    log.write_text("[  5.000000] amdgpu 0000:0c:00.0: amdgpu: hw_init of IP block <gfx_v11_0> failed -110\n")
    report = analyze_file(log)
    from gpuwarden.ops.triage.findings import line_of
    assert report.summary() == [line_of(f) for f in report.ordered() if f.severity != "info"]
