"""Which catalog entries a triage report's findings fit, and whether the node's versions are in their range.

A finding matches an issue when its rule is one the entry names and (if the entry has one) its pattern is in
the finding's own text: title, signature, quoted lines and details. Versions never hide a match: a node
outside the reported range is shown as such (a regression or a backport is as likely as a coincidence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from gpuwarden.ops.knowledge import versions
from gpuwarden.ops.knowledge.catalog import Catalog, Entry, load


@dataclass(frozen=True)
class Match:
    entry: Entry
    rule: str
    finding: str  # the finding's title
    versions: str  # "in range", "outside the reported range (...)", "not known" or "no range given"

    def to_dict(self) -> dict[str, Any]:
        e = self.entry
        return {"id": e.id, "title": e.title, "url": e.url, "rule": self.rule, "finding": self.finding,
                "versions": self.versions, "workaround": e.workaround or None, "fixed_in": e.fixed_in or None}


def _finding_text(f: Any) -> str:
    # One line each, "key=value" for details and victims, so a pattern can say which field it means.
    parts = [getattr(f, "title", "") or "", getattr(f, "signature", "") or ""]
    parts += list(getattr(f, "examples", None) or [])
    for k, v in (getattr(f, "details", None) or {}).items():
        values = v if isinstance(v, list) else [v]
        parts += [f"{k}={x}" for x in values if isinstance(x, (str, int))]
    for victim in getattr(f, "victims", None) or []:
        if isinstance(victim, dict) and victim.get("process"):
            parts.append(f"process={victim['process']}")
    return "\n".join(parts)


def version_verdict(entry: Entry, env: dict[str, str | None]) -> str:
    if not entry.versions:
        return "no range given"
    outside, unknown = [], []
    for comp, spec in entry.versions.items():
        ok = versions.in_range(env.get(comp), spec)
        if ok is None:
            unknown.append(comp)
        elif not ok:
            outside.append(f"{comp} {env.get(comp)} is not {spec}")
    if outside:
        return "outside the reported range (" + "; ".join(outside) + ")"
    if unknown:
        return "not known (" + ", ".join(unknown) + " version not recorded)"
    return "in range"


def match_findings(findings: Iterable[Any], env: dict[str, str | None] | None = None,
                   catalog: Catalog | None = None) -> list[Match]:
    """Every (entry, finding) pair that fits, one per entry (its first finding in the order given)."""
    cat = catalog or load()
    env = env or {}
    out: dict[str, Match] = {}
    for f in findings:
        candidates = cat.by_rule.get(getattr(f, "rule", ""), ())
        if not candidates:
            continue
        text = None
        for e in candidates:  # pattern-specific entries first (Catalog orders them)
            if e.id in out:
                continue
            if e.pattern is not None:
                text = text if text is not None else _finding_text(f)
                if not e.pattern.search(text):
                    continue
            out[e.id] = Match(e, f.rule, getattr(f, "title", ""), version_verdict(e, env))
    return list(out.values())


def cite(report: Any, env: dict[str, str | None] | None = None) -> list[Match]:
    """Match a triage Report's findings (most important first) and record the matches on it."""
    matches = match_findings(report.ordered(), env)
    report.known = [m.to_dict() for m in matches]
    return matches
