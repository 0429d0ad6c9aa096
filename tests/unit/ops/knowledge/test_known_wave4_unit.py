"""The unit half of tests/integration/ops/knowledge/test_known_wave4.py (its tests that need no process, socket or server); the pair's subject:
The catalog entries added in wave 4 (after the `# --- added in wave 4 ---` line of known_issues.toml): every
claim they make is located in a source (URL, locator, date checked, what is there) or marked as gpuwarden's own
reasoning, the catalog holds 70 or more entries, and the loader refuses evidence it could not show to an operator.
"""

from __future__ import annotations

import re
import tomllib

import pytest

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.knowledge import catalog, load

MARKER = "# --- added in wave 4 ---"
CLAIMS = ("title", "meaning", "maintainers", "workaround", "fixed_in")


def _wave4() -> list[dict]:
    text = (catalog._here() / catalog.DATA).read_text(encoding="utf-8")
    before, _, _ = text.partition(MARKER)
    assert MARKER in text
    ids_before = {m for m in re.findall(r'^id = "([^"]+)"', before, re.M)}
    return [e for e in tomllib.loads(text)["issue"] if e["id"] not in ids_before]


def test_the_catalog_has_grown_to_seventy_entries_with_twenty_new_ones():
    assert len(_wave4()) >= 20
    assert len(load()) >= 70


@pytest.mark.parametrize("raw", _wave4(), ids=lambda r: r["id"])
def test_every_claim_of_a_new_entry_is_located_or_marked_as_own_reasoning(raw):
    evidence = raw.get("evidence", [])
    assert isinstance(evidence, list) and evidence, "a wave-4 entry carries [[issue.evidence]] tables"
    located = {ev["claim"] for ev in evidence}
    own = set(raw.get("own_reasoning", []))
    for claim in CLAIMS:
        if raw.get(claim):
            assert claim in located or claim in own, f"{raw['id']}: {claim} has no evidence and is not own reasoning"
    assert not (own - set(CLAIMS))
    for ev in evidence:
        assert ev["url"].startswith("https://") and ev["locator"].strip() and ev["says"].strip()
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", ev["checked"])
        assert ev["url"] in [raw["url"], *raw.get("related", [])], f"{raw['id']}: evidence cites {ev['url']}, " \
            "which the entry does not list"


def test_myths_and_limits_have_no_signature_and_say_what_to_do():
    for raw in _wave4():
        e = load().get(raw["id"])
        assert e.workaround, e.id
        if e.kind in ("myth", "limit"):
            assert not e.rules and e.pattern_source is None, e.id


def test_the_compiled_catalog_keeps_the_evidence():
    e = load().get("myth-kfd-memory-policy")
    d = e.to_dict()
    assert d["kind"] == "myth" and d["own_reasoning"] == ["workaround"]
    assert {ev["claim"] for ev in d["sources"]} == {"title", "meaning"}  # gpuwarden.known/2's located evidence
    assert all(ev["locator"] for ev in d["sources"])


_BASE = '[[issue]]\nid = "x-y-z"\ntitle = "t"\nkind = "myth"\nmeaning = "m"\nurl = "https://e"\n'


@pytest.mark.parametrize("tail,message", [
    ('[[issue.evidence]]\nclaim = "meanng"\nurl = "https://e"\nlocator = "l"\nchecked = "2026-12-05"\nsays = "s"\n',
     "is not one of"),
    ('[[issue.evidence]]\nclaim = "meaning"\nurl = "http://e"\nlocator = "l"\nchecked = "2026-12-05"\nsays = "s"\n',
     "url must be an https://"),
    ('[[issue.evidence]]\nclaim = "meaning"\nurl = "https://e"\nchecked = "2026-12-05"\nsays = "s"\n', "lacks locator"),
    ('own_reasoning = ["workarond"]\n', "own_reasoning names workarond"),
])
def test_malformed_evidence_is_refused_with_what_to_fix(tail, message):
    with pytest.raises(GpuwardenError) as exc:
        catalog.parse(_BASE + tail)
    assert message in exc.value.message
