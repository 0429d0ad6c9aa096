"""Rough edges a new user hit on the command line (issue 36): one format for report's seconds, history's empty
bar, the arena's memory warning and mode."""

from __future__ import annotations

import re


def _report(registrations: list[dict]) -> dict:
    return {"title": "t", "bundle": "b.tar.gz", "environment": {}, "what_happened": {"registrations": registrations},
            "reproduction": {"why": "w"}, "ruled_out": [], "known_issues": [], "attachments_total": 0,
            "attachments_bytes": 0, "attachments": []}


def test_report_seconds_column_has_one_format():
    from gpuwarden.ops.bugreport.render import markdown
    regs = [{"engine": "dp0", "call": "hipHostRegister", "bytes": 1 << 30, "outcome": "registered", "result": 0,
             "seconds": 0.1234},
            {"engine": "dp1", "call": "hipHostRegister", "bytes": 1 << 30, "outcome": "failed", "result": 1,
             "seconds": 0.1 + 0.2},
            {"engine": "dp2", "call": "hipHostRegister", "bytes": 1 << 30, "outcome": "running", "result": None,
             "seconds": None}]
    rows = [line for line in markdown(_report(regs)).splitlines() if line.startswith("| dp")]
    cells = [row.rstrip(" |").rsplit("| ", 1)[1] for row in rows]
    assert cells == ["0.123", "0.300", "not recorded"], cells
    assert all(re.fullmatch(r"\d+\.\d{3}|not recorded", c) for c in cells)
