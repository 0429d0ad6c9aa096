"""The catalog for people and scripts: one entry in full, a listing, and the gpuwarden.known/2 document.

Used by `gpuwarden known`, `triage --explain ID` and `report`; plain text, no terminal styling. Under each claim
come the places it was found (URL, locator, date checked), or a line saying it is gpuwarden's own reasoning.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.knowledge.catalog import Entry
from gpuwarden.ops.foundation.jsondoc import document

SCHEMA = "known"
VERSION = 2  # 2: kind "myth", "check", "sources" (located evidence) and "own_reasoning"; nothing of 1 removed
OWN = "    (gpuwarden's own reasoning: no upstream source says this)"
OWN_TOO = "    (and in part gpuwarden's own reasoning, beyond what the sources above say)"
UNLOCATED = "    (not located in a source yet: treat as unconfirmed)"
KIND_NOTE = {"myth": "myth: claimed somewhere, but does not exist or does not do what is claimed"}


def _located(e: Entry, claim: str) -> list[str]:
    """The lines under one claim: each source, then whether it is gpuwarden's own reasoning or unlocated."""
    out = [f"    - {ev.url} ({ev.locator}; checked {ev.checked}): {ev.says}" for ev in e.sources(claim)]
    if claim in e.own_reasoning:
        out.append(OWN_TOO if out else OWN)
    elif not out and claim != "title":
        out.append(UNLOCATED)
    return out


def entry_text(e: Entry) -> str:
    lines = [f"{e.id}  ({KIND_NOTE.get(e.kind, e.kind)})", f"  {e.title}"]
    lines += [ln for ln in _located(e, "title") if ln != UNLOCATED] + [""]
    if e.rules:
        sig = "rules " + ", ".join(e.rules)
        if e.pattern is not None:
            sig += f"; text matching /{e.pattern.pattern}/"
        if e.versions:
            sig += "; reported on " + ", ".join(f"{k} {v}" for k, v in e.versions.items())
        if e.gpus:
            sig += "; GPUs " + ", ".join(e.gpus)
        lines += [f"Signature: {sig}", ""]
    lines += [f"What it means: {e.meaning}", *_located(e, "meaning"), ""]
    for label, claim, value in (("What upstream said", "maintainers", e.maintainers),
                                ("How to check", None, e.check), ("Caveats", None, e.caveats),
                                ("Workaround", "workaround", e.workaround), ("Fixed in", "fixed_in", e.fixed_in)):
        if value:
            lines += [f"{label}: {value}", *(_located(e, claim) if claim else []), ""]
    lines.append(f"Upstream: {e.url}")
    lines += [f"Related: {u}" for u in e.related]
    return "\n".join(lines) + "\n"


def listing(entries: list[Entry]) -> str:
    width = max((len(e.id) for e in entries), default=0)
    tag = {"alternative": "alt ", "myth": "myth ", "limit": "limit "}
    return "".join(f"{e.id:{width}}  {tag.get(e.kind, '')}{e.title}\n" for e in entries)


def as_document(query: str | None, entries: list[Entry], total: int) -> dict[str, Any]:
    return document(SCHEMA, {"query": query, "total": total, "count": len(entries),
                             "entries": [e.to_dict() for e in entries]}, VERSION)
