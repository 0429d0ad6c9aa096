"""The catalog of known issues: entries read from known_issues.toml (package data), checked as they load.

An entry is an `issue` (a signature a triage finding can match: the rules it comes from, a pattern in
the finding's text, the versions it was reported on), an `alternative` (a way around a limit, with how to
check it and its caveats, cited by `arena budget`, `doctor` and `report`) or a `myth` (a knob or behaviour
that is claimed somewhere but does not exist or does not do what is claimed). Each claim an entry makes
(meaning, maintainers, workaround, fixed_in) carries located evidence (`Evidence`: URL, a locator a reader
finds in seconds, the date checked, what is there in gpuwarden's words) or is named in `own_reasoning`.
Nothing here knows the triage rules: the tests check that every rule an entry names exists.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.knowledge import versions

DATA = "known_issues.toml"
COMPILED = "known_issues.json"
KINDS = ("issue", "alternative", "myth", "limit")
# The fields an evidence item can back; CHECKED_CLAIMS are those that, when an entry has them, must be located.
CLAIMS = ("title", "meaning", "maintainers", "workaround", "fixed_in")
CHECKED_CLAIMS = ("meaning", "maintainers", "workaround", "fixed_in")
_EVIDENCE_KEYS = ("claim", "url", "locator", "checked", "says")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ID = re.compile(r"^[a-z0-9][a-z0-9.-]{2,79}$")
_REQUIRED = ("id", "title", "kind", "meaning", "url")
_KEYS = frozenset(_REQUIRED + ("signature", "related", "maintainers", "workaround", "fixed_in", "evidence", "caveats",
                               "topics", "check", "own_reasoning"))
_TEXT = ("maintainers", "workaround", "fixed_in", "check", "caveats")


@dataclass(frozen=True)
class Evidence:
    """Where one claim of an entry comes from: `says` is gpuwarden's paraphrase of what is at `url` + `locator`."""
    claim: str
    url: str
    locator: str  # "comment by @fxkamd, 2024-05-02", "commit 1a2b3c4", "file.c: function", "section 'X'"
    checked: str  # YYYY-MM-DD: when someone last read it there
    says: str

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in _EVIDENCE_KEYS}
_SIG_KEYS = frozenset(("rules", "pattern", "versions", "gpus"))


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    kind: str
    meaning: str
    url: str
    rules: tuple[str, ...] = ()
    pattern_source: str | None = None  # compiled on first use: most entries' rules never fire in one report
    versions: dict[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()
    related: tuple[str, ...] = ()
    maintainers: str = ""
    workaround: str = ""
    fixed_in: str = ""
    check: str = ""  # an alternative: how to see it on this node (was `evidence = "..."` before located evidence)
    caveats: str = ""
    topics: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    own_reasoning: tuple[str, ...] = ()  # claims that are gpuwarden's reasoning, not something upstream said

    def sources(self, claim: str) -> list[Evidence]:
        return [ev for ev in self.evidence if ev.claim == claim]

    def unlocated(self) -> list[str]:
        """The claims this entry makes with neither located evidence nor an own_reasoning mark."""
        return [c for c in CHECKED_CLAIMS
                if getattr(self, c) and c not in self.own_reasoning and not self.sources(c)]

    @property
    def pattern(self) -> "re.Pattern[str] | _Literals | None":
        return _compile(self.pattern_source) if self.pattern_source else None

    def text(self) -> str:
        """Everything a search looks through, lower-cased."""
        return " ".join((self.id, self.title, self.meaning, self.maintainers, self.workaround, self.fixed_in,
                         self.check, self.caveats, " ".join(self.rules), " ".join(self.gpus),
                         " ".join(self.topics), self.url,
                         " ".join(f"{ev.url} {ev.locator} {ev.says}" for ev in self.evidence))).lower()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "title": self.title, "kind": self.kind, "meaning": self.meaning,
                               "url": self.url, "related": list(self.related)}
        if self.kind == "issue" or self.rules:
            out["signature"] = {"rules": list(self.rules), "pattern": self.pattern_source,
                                "versions": dict(self.versions), "gpus": list(self.gpus)}
        for name in ("maintainers", "workaround", "fixed_in", "caveats"):
            out[name] = getattr(self, name) or None
        # gpuwarden.known/1 had "evidence" as the alternative's check text: kept under that key for its readers
        out["evidence"] = out["check"] = self.check or None
        out["topics"] = list(self.topics)
        out["sources"] = [ev.to_dict() for ev in self.evidence]
        out["own_reasoning"] = list(self.own_reasoning)
        return out


class Catalog:
    """The entries, in file order, with lookups by id, by rule and by words."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.by_id = {e.id: e for e in entries}
        self.by_rule: dict[str, list[Entry]] = {}
        for e in entries:
            for r in e.rules:
                self.by_rule.setdefault(r, []).append(e)
        for listed in self.by_rule.values():  # an entry with a pattern says more than one matching the rule alone
            listed.sort(key=lambda e: e.pattern_source is None)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, entry_id: str) -> Entry | None:
        return self.by_id.get(entry_id.strip().lower())

    def search(self, query: str | None) -> list[Entry]:
        """Entries holding every word of the query (any case); all of them for no query."""
        words = (query or "").lower().split()
        return [e for e in self.entries if all(w in e.text() for w in words)]

    def topic(self, name: str) -> list[Entry]:
        return [e for e in self.entries if name in e.topics]


def _strings(raw: dict[str, object], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise GpuwardenError(f"{where}: {key} must be a list of strings", "fix the catalog entry")
    return tuple(value)


_PLAIN = re.compile(r"[\w .,:'=/-]+(?:\|[\w .,:'=/-]+)*")


class _Literals:
    """A pattern that is only literal words joined by |: substring tests, ~100x cheaper to build than a regex."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.words = tuple(w.lower() for w in pattern.split("|"))

    def search(self, text: str) -> bool:
        low = text.lower()
        return any(w in low for w in self.words)


@lru_cache(maxsize=256)
def _compile(pattern: str) -> "re.Pattern[str] | _Literals":
    """Case-insensitive matcher of a signature pattern (compiled once per process, on first use)."""
    if _PLAIN.fullmatch(pattern):
        return _Literals(pattern)
    return re.compile(pattern, re.IGNORECASE)


def parse_entry(raw: Any, index: int, compile_patterns: bool = True) -> Entry:
    where = f"{DATA} entry {index + 1}"
    if not isinstance(raw, dict):
        raise GpuwardenError(f"{where} is not a table", "each entry is an [[issue]] table")
    where = f"{DATA} entry {raw.get('id', index + 1)!s}"
    missing = [k for k in _REQUIRED if not isinstance(raw.get(k), str) or not raw[k].strip()]
    if missing:
        raise GpuwardenError(f"{where} lacks {', '.join(missing)}", "every entry needs " + ", ".join(_REQUIRED))
    unknown = sorted(set(raw) - _KEYS) + sorted(f"signature.{k}" for k in set(raw.get("signature") or {}) - _SIG_KEYS)
    if unknown:
        raise GpuwardenError(f"{where}: unknown key(s) {', '.join(unknown)}", "fix the spelling (see the file's header)")
    if not _ID.match(raw["id"]):
        raise GpuwardenError(f"{where}: id must be lower-case letters, digits, dots and dashes", "rename it")
    if raw["kind"] not in KINDS:
        raise GpuwardenError(f"{where}: kind must be one of {', '.join(KINDS)}", "fix the kind")
    if not raw["url"].startswith("https://"):
        raise GpuwardenError(f"{where}: url must be an https:// link to the upstream issue or document", "fix it")
    sig = raw.get("signature") or {}
    if not isinstance(sig, dict):
        raise GpuwardenError(f"{where}: signature must be a table", "fix it")
    rules = _strings(sig, "rules", where)
    if raw["kind"] == "issue" and not rules:
        raise GpuwardenError(f"{where}: an issue needs signature.rules (the triage rules it comes from)", "add them")
    pattern = sig.get("pattern") or None
    if pattern is not None:
        if not isinstance(pattern, str):
            raise GpuwardenError(f"{where}: signature.pattern must be a string", "fix it")
        if compile_patterns:
            try:
                _compile(pattern)
            except re.error as exc:
                raise GpuwardenError(f"{where}: signature.pattern does not compile: {exc}", "fix the regex") from None
    ranges = sig.get("versions") or {}
    if not isinstance(ranges, dict):
        raise GpuwardenError(f"{where}: signature.versions must be a table", "fix it")
    for comp, spec in ranges.items():
        if comp not in versions.COMPONENTS or not isinstance(spec, str):
            raise GpuwardenError(f"{where}: versions.{comp} is not one of {', '.join(versions.COMPONENTS)}",
                                 "fix the component name")
        bad = versions.check_range(spec)
        if bad:
            raise GpuwardenError(f"{where}: versions.{comp}: {bad}", "fix the range")
    evidence_raw = raw.get("evidence", [])
    if isinstance(evidence_raw, str):  # the old spelling of an alternative's check
        if "check" in raw:
            raise GpuwardenError(f"{where}: both check and a text evidence", "keep check; evidence is [[issue.evidence]]")
        raw = {**raw, "check": evidence_raw}
        evidence_raw = []
    text = {k: raw.get(k, "") for k in _TEXT}
    for k, v in text.items():
        if not isinstance(v, str):
            raise GpuwardenError(f"{where}: {k} must be a string", "fix it")
    evidence = _evidence(evidence_raw, where)
    own = _strings(raw, "own_reasoning", where)
    not_claims = [c for c in own if c not in CLAIMS]
    if not_claims:
        raise GpuwardenError(f"{where}: own_reasoning names {', '.join(not_claims)}, not a claim",
                             "name fields among " + ", ".join(CLAIMS))
    return Entry(id=raw["id"], title=raw["title"].strip(), kind=raw["kind"], meaning=raw["meaning"].strip(),
                 url=raw["url"].strip(), rules=rules, pattern_source=pattern, versions=dict(ranges),
                 gpus=_strings(sig, "gpus", where), related=_strings(raw, "related", where),
                 topics=_strings(raw, "topics", where), evidence=evidence, own_reasoning=own,
                 **{k: v.strip() for k, v in text.items()})


def _evidence(items: Any, where: str) -> tuple[Evidence, ...]:
    """The [[issue.evidence]] tables, each checked: a known claim, an https URL, a locator, a date, a paraphrase."""
    if not isinstance(items, list):
        raise GpuwardenError(f"{where}: evidence must be [[issue.evidence]] tables", "see the file's header")
    out = []
    for n, item in enumerate(items, 1):
        at = f"{where} evidence {n}"
        if not isinstance(item, dict):
            raise GpuwardenError(f"{at} is not a table", "write it as [[issue.evidence]]")
        unknown = sorted(set(item) - set(_EVIDENCE_KEYS))
        if unknown:
            raise GpuwardenError(f"{at}: unknown key(s) {', '.join(unknown)}", "keys are " + ", ".join(_EVIDENCE_KEYS))
        missing = [k for k in _EVIDENCE_KEYS if not isinstance(item.get(k), str) or not item[k].strip()]
        if missing:
            raise GpuwardenError(f"{at} lacks {', '.join(missing)}", "every evidence item needs "
                                 + ", ".join(_EVIDENCE_KEYS))
        if item["claim"] not in CLAIMS:
            raise GpuwardenError(f"{at}: claim {item['claim']!r} is not one of {', '.join(CLAIMS)}", "fix the claim")
        if not item["url"].startswith("https://"):
            raise GpuwardenError(f"{at}: url must be an https:// link", "fix it")
        if not _DATE.match(item["checked"]):
            raise GpuwardenError(f"{at}: checked must be a date YYYY-MM-DD", "write the day it was read")
        out.append(Evidence(**{k: item[k].strip() for k in _EVIDENCE_KEYS}))
    return tuple(out)


def parse(text: str, compile_patterns: bool = True) -> Catalog:
    # deferred: keeps `gpuwarden bundle --help` cheap (3.1 ms there)
    import tomllib
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GpuwardenError(f"{DATA} is not valid TOML: {exc}", "fix the catalog file") from None
    return from_document(doc, compile_patterns)


def from_document(doc: dict[str, object], compile_patterns: bool = True) -> Catalog:
    raw = doc.get("issue", [])
    if not isinstance(raw, list):
        raise GpuwardenError(f"{DATA}: entries must be [[issue]] tables", "fix the catalog file")
    entries = [parse_entry(r, i, compile_patterns) for i, r in enumerate(raw)]
    seen: set[str] = set()
    for e in entries:
        if e.id in seen:
            raise GpuwardenError(f"{DATA}: id {e.id} appears twice", "give each entry its own id")
        seen.add(e.id)
    return Catalog(entries)


def _trusted(doc: dict[str, Any]) -> Catalog:
    """Entries of a document the build already checked (known_issues.json): no validation, no compiling, so its
    values are read as the build wrote them."""
    entries = []
    for raw in doc["issue"]:
        sig = raw.get("signature") or {}
        evidence = raw.get("evidence", [])
        if isinstance(evidence, str):
            raw = {**raw, "check": evidence}
            evidence = []
        entries.append(Entry(
            id=raw["id"], title=raw["title"].strip(), kind=raw["kind"], meaning=raw["meaning"].strip(),
            url=raw["url"].strip(), rules=tuple(sig.get("rules", ())), pattern_source=sig.get("pattern") or None,
            versions=dict(sig.get("versions") or {}), gpus=tuple(sig.get("gpus", ())),
            related=tuple(raw.get("related", ())), topics=tuple(raw.get("topics", ())),
            evidence=tuple(Evidence(**{k: ev[k].strip() for k in _EVIDENCE_KEYS}) for ev in evidence),
            own_reasoning=tuple(raw.get("own_reasoning", ())),
            **{k: raw.get(k, "").strip() for k in _TEXT}))
    return Catalog(entries)


_DIR = Path(__file__).parent


def _here() -> Path:
    return _DIR


@lru_cache(maxsize=1)
def load() -> Catalog:
    """The shipped catalog, read once per process.

    known_issues.toml is the source; known_issues.json beside it is the same document as JSON (made by
    `python -m gpuwarden.ops.knowledge.build`), used only while it records the TOML's sha256: parsing TOML in
    Python costs ~9 ms, JSON ~0.3 ms, and triage pays it on every run. A TOML edited on the node is read as TOML.
    """
    text = (_here() / DATA).read_bytes()
    try:
        doc = json.loads((_here() / COMPILED).read_bytes())
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and doc.get("toml_sha256") == hashlib.sha256(text).hexdigest():
        return _trusted(doc)
    return parse(text.decode("utf-8"))
