"""The unit half of tests/integration/ops/knowledge/test_known_issues.py (its tests that need no process, socket or server); the pair's subject:
The catalog of known issues (ops/knowledge): it loads and is well-formed, every claim is located in a source
or marked as gpuwarden's own reasoning, every id the code cites exists, every entry with a log signature matches
a real log excerpt it was written from (tests/fixtures/SOURCES.md, tests/triage_corpus/SOURCES.md), healthy logs
match nothing, and `triage`, `triage --json` and `gpuwarden known` cite or list the entries.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers.known_excerpts import CASES
from helpers.paths import REPO
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.knowledge import catalog, cite, load, match_findings, versions
from gpuwarden.ops.triage import explain
from gpuwarden.ops.triage import analyze_file, analyze_text

TESTS = REPO / "tests"

# more excerpts of the same issue from other threads
MORE = [("gfx1103-mes-remove-queue-cwsr", "fixtures/known/rocm6018_780m_mes_remove_queue_doorbell_mode2.log"),
        ("mes-firmware-0x83-strix-halo", "fixtures/known/rocm6018_780m_mes_remove_queue_doorbell_mode2.log"),
        ("amdgpu-gfxhub-fault-rdna3-tcp", "fixtures/dmesg/rocm5745_gfx1151_gfxhub_pagefault_mes_sq_intr_gpu_reset_mode2.log")]
# An entry written from a kernel source and AMD's own documentation change rather than a public log: its
# test line is the message gpuwarden's canary prints when hipHostRegister fails (ops/register/gpu.py).
SOURCE_ONLY = {"kfd-system-mem-limit-pinned-after-registration":
               "hipHostRegister failed: hipErrorOutOfMemory (out of memory) registering 64.0 GiB at 0x7f0000000000 "
               "on GPU 3",
               # cited by rank only (ops/triage/kfdrank.py) until its own rules name the registration failure
               "kfd-system-mem-limit-shared-registration": None,

               # clr ihipHostRegister's failed create() (hip_memory.cpp), as the canary reports it
               "hip-register-invalid-value-cannot-back":
               "hipHostRegister failed: hipErrorInvalidValue (invalid argument) registering 64.0 GiB at 0x7f0000000000 "
               "on GPU 3",
               # the kernel's own line: kfd_svm.c svm_range_new's pr_info (pr_fmt "amdgpu: ")
               "kfd-svm-exceeds-resident-limit":
               "[ 8123.456789] amdgpu: SVM mapping failed, exceeds resident system memory limit"}
HEALTHY = ("triage_corpus/c60_rocm361_benign_boot_ras_collector_negative.log",
           "triage_corpus/c62_lact1180_benign_amdgpu_init_negative.log")


def _rule_ids() -> set[str]:
    return {e.id for e in explain.entries()}


def test_catalog_is_big_enough_and_every_issue_has_a_real_excerpt():
    cat = load()
    issues = [e for e in cat.entries if e.kind == "issue"]
    assert len(issues) >= 30
    assert {e.id for e in issues} <= set(CASES) | set(SOURCE_ONLY)
    public = [e for e in issues if e.id in CASES]
    assert len(public) >= 30 and all("github.com" in e.url for e in public)


def test_every_entry_with_a_log_signature_has_an_excerpt_test():
    """An entry triage can cite (it names rules: every issue, and a myth with a log line) is tested on a real
    excerpt in CASES/MORE, or on the line gpuwarden itself prints (SOURCE_ONLY); every test names an entry."""
    cat = load()
    tested = set(CASES) | {i for i, _ in MORE} | set(SOURCE_ONLY)
    untested = sorted(e.id for e in cat.entries if e.rules and e.id not in tested)
    assert not untested, f"entries with a log signature but no excerpt test (add them to CASES): {untested}"
    assert sorted(tested - set(cat.by_id)) == [], "excerpt tests name entries the catalog lacks"


# --- located evidence -------------------------------------------------------------------------------------

def test_every_claim_is_located_or_marked_as_own_reasoning():
    missing = {e.id: e.unlocated() for e in load().entries if e.unlocated()}
    assert not missing, ("claims with no [[issue.evidence]] and not in own_reasoning (locate them or mark them): "
                         f"{missing}")


# Where code cites catalog entries: an operator is told `gpuwarden known <id>`, or code looks an id up.
_CITED = (re.compile(r"gpuwarden known ([a-z0-9][a-z0-9.]*-[a-z0-9.-]*[a-z0-9])"),
          re.compile(r"(?:known|catalog)_?(?:id|ids|entry|entries)\s*(?:=|:|\()\s*[\[(]?\s*[\"']([a-z0-9][a-z0-9.-]+)"),
          re.compile(r"(?:load\(\)|catalog|cat)\.(?:get|by_id)\s*[(\[]\s*[\"']([a-z0-9][a-z0-9.-]+)"))


def _cited_ids(text: str) -> set[str]:
    return {m.group(1) for rx in _CITED for m in rx.finditer(text)}


def test_the_citation_scanner_finds_every_way_code_cites_an_id():
    text = ('hint = "see `gpuwarden known mes-no-such-entry` for more"\n'
            'finding.known_id = "kfd-made-up"\n'
            'e = knowledge.load().get("amdgpu-made-up")\n'
            'words = "`gpuwarden known arena` searches"\n')
    assert _cited_ids(text) == {"mes-no-such-entry", "kfd-made-up", "amdgpu-made-up"}


def test_every_id_cited_by_code_or_by_another_entry_is_in_the_catalog():
    cat = load()
    cited: dict[str, set[str]] = {}
    for top in ("ops", "playbooks", "tui"):
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix not in {".py", ".toml", ".yaml", ".yml", ".md"} or path.name.startswith("known_issues"):
                continue
            for i in _cited_ids(path.read_text(encoding="utf-8", errors="replace")):
                cited.setdefault(i, set()).add(str(path.relative_to(REPO)))
    for e in cat.entries:
        for i in _cited_ids(" ".join((e.meaning, e.maintainers, e.workaround, e.fixed_in, e.check, e.caveats))):
            cited.setdefault(i, set()).add(f"catalog entry {e.id}")
    absent = {i: sorted(where) for i, where in cited.items() if i not in cat.by_id}
    assert not absent, f"ids cited but not in the catalog: {absent}"


_ENTRY = '[[issue]]\nid = "x-y-z"\ntitle = "t"\nkind = "myth"\nmeaning = "m"\nurl = "https://e"\n'
_EV = '[[issue.evidence]]\nclaim = "meaning"\nurl = "https://e"\nlocator = "l"\nchecked = "2026-12-05"\nsays = "s"\n'


@pytest.mark.parametrize("text,message", [
    (_ENTRY + _EV.replace('"meaning"', '"meening"'), "claim 'meening' is not one of"),
    (_ENTRY + _EV.replace('locator = "l"\n', ""), "lacks locator"),
    (_ENTRY + _EV.replace("2026-12-05", "5 Dec"), "checked must be a date"),
    (_ENTRY + _EV.replace('url = "https://e"', 'url = "e.org"'), "url must be an https:// link"),
    (_ENTRY + _EV + 'quote = "pasted"\n', "unknown key(s) quote"),
    (_ENTRY + 'own_reasoning = ["workarround"]\n', "own_reasoning names workarround"),
    (_ENTRY.replace('"myth"', '"rumour"'), "kind must be"),
])
def test_malformed_evidence_is_refused_with_what_to_fix(text, message):
    with pytest.raises(GpuwardenError) as exc:
        catalog.parse(text)
    assert message in exc.value.message


_MYTH = """[[issue]]
id = "made-up-knob"
title = "options made_up knob=1 does nothing"
kind = "myth"
meaning = "No module has this parameter."
url = "https://example.org/article"
workaround = "Leave it out."
own_reasoning = ["workaround"]

[[issue.evidence]]
claim = "meaning"
url = "https://example.org/source.c"
locator = "drivers/x/source.c: module parameter list"
checked = "2026-12-05"
says = "the parameter list has no knob"
"""


def test_a_myth_is_shown_as_one_with_its_sources_and_its_own_reasoning():
    from gpuwarden.ops.knowledge.render import OWN, UNLOCATED, entry_text, listing
    e = catalog.parse(_MYTH).get("made-up-knob")
    assert e.kind == "myth" and e.unlocated() == []
    text = entry_text(e)
    assert "(myth: claimed somewhere, but does not exist" in text
    meaning, workaround = text.split("What it means:")[1].split("Workaround:")
    assert "https://example.org/source.c (drivers/x/source.c: module parameter list; checked 2026-12-05)" in meaning
    assert OWN in workaround.split("Upstream:")[0] and "example.org" not in workaround.split("Upstream:")[0]
    assert "myth options made_up" in listing([e])
    bare = catalog.parse(_MYTH.replace('own_reasoning = ["workaround"]\n', "")).get("made-up-knob")
    assert bare.unlocated() == ["workaround"] and UNLOCATED in entry_text(bare)


def test_version_2_only_adds_to_version_1():
    """A reader of gpuwarden.known/1 still validates what version 2 says about issues and alternatives."""
    from gpuwarden.ops.foundation import jsondoc
    from gpuwarden.ops.knowledge.render import as_document
    cat = load()
    doc = as_document(None, [e for e in cat.entries if e.kind != "myth"], len(cat))
    jsondoc.validate(doc)
    assert any(e["sources"] for e in doc["entries"])
    jsondoc.validate({**doc, "schema": "gpuwarden.known/1"})
    myth = as_document(None, catalog.parse(_MYTH).entries, 1)
    jsondoc.validate(myth)
    assert myth["entries"][0]["kind"] == "myth" and myth["entries"][0]["own_reasoning"] == ["workaround"]


def test_every_rule_an_entry_names_exists_and_every_entry_says_what_to_do():
    known_rules = _rule_ids()
    for e in load().entries:
        assert set(e.rules) <= known_rules, (e.id, set(e.rules) - known_rules)
        assert e.url.startswith("https://") and e.meaning and e.title
        if e.kind == "issue":
            assert e.workaround, e.id
            assert e.maintainers, e.id  # what upstream said, or that nothing was recorded
        elif e.kind == "myth":
            assert e.workaround, e.id  # what to do instead
        elif e.kind == "alternative":
            assert e.caveats and e.check, e.id


def test_every_excerpt_is_listed_in_a_sources_file():
    sources = (TESTS / "fixtures/SOURCES.md").read_text() + (TESTS / "triage_corpus/SOURCES.md").read_text()
    for path in list(CASES.values()) + [p for _, p in MORE]:
        stem = Path(path).name.rsplit(".", 1)[0]
        assert stem in sources, path
    for p in (TESTS / "fixtures/known").iterdir():
        assert f"known/{p.name}" in sources, p.name


@pytest.mark.parametrize("entry_id,path", sorted(CASES.items()) + MORE)
def test_entry_matches_the_excerpt_it_was_written_from(entry_id, path):
    report = analyze_file(TESTS / path)
    matches = cite(report)
    assert entry_id in [m.entry.id for m in matches], [f.rule for f in report.findings]
    assert any(k["id"] == entry_id for k in report.to_dict()["known_issues"])


@pytest.mark.parametrize("entry_id,line", sorted((k, v) for k, v in SOURCE_ONLY.items() if v is not None))
def test_source_only_entry_matches_the_line_it_was_written_from(entry_id, line):
    report = analyze_text(line, source="canary.log")
    assert entry_id in [m.entry.id for m in cite(report)]


@pytest.mark.parametrize("path", HEALTHY)
def test_healthy_logs_match_nothing(path):
    assert cite(analyze_file(TESTS / path)) == []


def test_a_pattern_specific_entry_is_cited_before_a_rule_only_one():
    report = analyze_file(TESTS / CASES["mes-firmware-0x83-strix-halo"])
    ids = [m.entry.id for m in cite(report)]
    # the finding's rule names both; the one whose pattern fits comes first within that finding
    assert ids.index("mes-firmware-0x83-strix-halo") < len(ids)


def test_versions_in_and_out_of_range_are_said_never_hidden():
    e = load().get("nvidia-gsp-heartbeat-timeout-open595")
    report = analyze_file(TESTS / CASES[e.id])
    (m,) = [m for m in match_findings(report.ordered(), {"nvidia": "595.71.05"}) if m.entry.id == e.id]
    assert m.versions == "in range"
    (m,) = [m for m in match_findings(report.ordered(), {"nvidia": "570.124.06"}) if m.entry.id == e.id]
    assert m.versions.startswith("outside the reported range") and "570.124.06" in m.versions
    (m,) = [m for m in match_findings(report.ordered(), {}) if m.entry.id == e.id]
    assert m.versions.startswith("not known")


@pytest.mark.parametrize("version,spec,want", [
    ("6.8.0-45-generic", ">=6.8,<6.10", True), ("6.10.3", ">=6.8,<6.10", False), ("570.124.06", ">=570", True),
    ("6.2.41133-dd7f95766", "==6.2", True), ("6.3.0", "==6.2", False), (None, ">=1", None), ("abc", ">=1", None),
])
def test_version_ranges(version, spec, want):
    assert versions.in_range(version, spec) is want


@pytest.mark.parametrize("text,message", [
    ('[[issue]]\nid = "x-y-z"\ntitle = "t"\nkind = "issue"\nmeaning = "m"\nurl = "https://e"\n', "signature.rules"),
    ('[[issue]]\nid = "x-y-z"\ntitle = "t"\nkind = "issue"\nmeaning = "m"\nurl = "https://e"\n'
     'signature = { rules = ["a"], pattern = "(" }\n', "does not compile"),
    ('[[issue]]\nid = "x-y-z"\ntitle = "t"\nkind = "issue"\nmeaning = "m"\nurl = "https://e"\n'
     'signature = { rules = ["a"], versions = { kernel = "about 6" } }\n', "bad version clause"),
    ('[[issue]]\nid = "x-y-z"\ntitle = "t"\nkind = "issue"\nmeaning = "m"\nurl = "https://e"\nworkround = "w"\n'
     'signature = { rules = ["a"] }\n', "unknown key(s) workround"),
    ('[[issue]]\nid = "x-y-z"\ntitle = "t"\nkind = "alternative"\nmeaning = "m"\nurl = "http://e"\n', "https://"),
    ('[[issue]]\nid = "Bad Id"\ntitle = "t"\nkind = "alternative"\nmeaning = "m"\nurl = "https://e"\n', "id must"),
])
def test_a_malformed_entry_is_refused_with_what_to_fix(text, message):
    with pytest.raises(GpuwardenError) as exc:
        catalog.parse(text)
    assert message in exc.value.message


def test_search_needs_every_word():
    cat = load()
    assert {e.id for e in cat.search("gsp timeout")} >= {"nvidia-gsp-rpc-timeout-xid119",
                                                         "nvidia-gsp-heartbeat-timeout-open595"}
    assert cat.search("gsp strixhalo-no-such-word") == []
    assert "gfx1103-mes-remove-queue-cwsr" in {e.id for e in cat.search("schung-amd vgprs")}  # evidence is searched
    assert len(cat.search(None)) == len(cat)
    assert {e.id for e in cat.topic("arena")} >= {"arena-alt-one-gpu-visible", "arena-alt-vmm-host-fd",
                                                  "kfd-system-mem-limit-shared-registration"}


def test_doctor_checks_that_did_not_pass_cite_their_entries():
    from gpuwarden.ops.doctor.model import FAIL, PASS, Finding
    from gpuwarden.ops.doctor.runner import cite_known
    budget = Finding("kfd-budget", "KFD registration budget", "memory", FAIL, "does not fit", None, [], {}, 0.01)
    fine = Finding("kfd-limit", "no_system_mem_limit", "driver", PASS, "ok", None, [], {}, 0.01)
    cite_known([budget, fine])
    ids = [k["id"] for k in budget.known]
    assert {"kfd-system-mem-limit-shared-registration", "arena-alt-one-gpu-visible", "arena-alt-stagger",
            "arena-alt-no-system-mem-limit", "arena-alt-chunked-registration-no-help", "arena-alt-vmm-host-fd",
            "arena-alt-xnack-svm"} <= set(ids)
    assert fine.known == [] and "known" not in fine.to_dict()


def test_every_doctor_topic_names_a_real_check():
    from gpuwarden.ops.doctor.checks import REGISTRY
    ids = {c.id for c in REGISTRY}
    for e in load().entries:
        for t in e.topics:
            if t.startswith("doctor:"):
                assert t[len("doctor:"):] in ids, (e.id, t)


def test_the_compiled_json_is_current_and_loads_like_the_toml():
    from gpuwarden.ops.knowledge import build
    shipped = (catalog._here() / catalog.COMPILED).read_text(encoding="utf-8")
    assert shipped == build.build(), "known_issues.json is stale: run python -m gpuwarden.ops.knowledge.build"
    from_toml = catalog.parse((catalog._here() / catalog.DATA).read_text(encoding="utf-8"))
    assert [e.to_dict() for e in load().entries] == [e.to_dict() for e in from_toml.entries]


def test_an_edited_toml_is_read_as_toml(tmp_path, monkeypatch):
    import shutil
    shutil.copy(catalog._here() / catalog.COMPILED, tmp_path / catalog.COMPILED)
    text = (catalog._here() / catalog.DATA).read_text(encoding="utf-8").replace(
        'title = "NVIDIA Xid 94:', 'title = "EDITED Xid 94:')
    (tmp_path / catalog.DATA).write_text(text, encoding="utf-8")
    monkeypatch.setattr(catalog, "_here", lambda: tmp_path)
    catalog.load.cache_clear()
    try:
        assert catalog.load().get("nvidia-xid94-contained-ecc").title.startswith("EDITED")
    finally:
        catalog.load.cache_clear()
