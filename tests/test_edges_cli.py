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


def test_history_never_draws_an_empty_bar():
    # Issue 36: `history` drew a series with nothing above zero as `||`.
    from gpuwarden.playbooks.cli.commands.history import _bar
    assert _bar("residual", [0, 0, 0], 1.0) == "  residual 0 B throughout (3 points)"
    assert _bar("used", [0, 0], 0) == "  used     0 B throughout (2 points)"
    assert _bar("used", [None, None], 0) == "  used     no readings (2 points)"
    drawn = _bar("used", [0, 5, 10], 10)
    assert drawn.startswith("  used     |") and drawn.endswith("|") and "||" not in drawn and drawn.count("█") == 1
