"""The unit half of tests/integration/ops/triage/test_triage_input.py (its tests that need no process, socket or server); the pair's subject:
`gpuwarden triage` on hostile and odd input, through the real CLI: FIFOs, devices, pipes, empty and binary
files, terminal escapes in a log, and the --explain / --json contracts.
"""

from __future__ import annotations


import pytest

from helpers.paths import REPO

from gpuwarden.ops.triage import explain

CORPUS = REPO / "tests" / "triage_corpus"


@pytest.mark.parametrize("rule_id", [e.id for e in explain.entries()])
def test_every_rule_id_a_report_can_carry_is_explained(rule_id):
    assert explain.lookup(rule_id) is not None


def test_findings_only_carry_explained_rules():
    from gpuwarden.ops.triage import analyze_file
    known = {e.id for e in explain.entries()}
    for log in sorted(CORPUS.glob("*.log")):
        for f in analyze_file(log).findings:
            assert f.rule in known, (log.name, f.rule)
