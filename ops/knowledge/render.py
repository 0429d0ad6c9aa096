"""The catalog for people and scripts: one entry in full, a listing, and the gpuwarden.known/1 document.

Used by `gpuwarden known`, `triage --explain ID` and `report`; plain text, no terminal styling.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.knowledge.catalog import Entry
from gpuwarden.ops.foundation.jsondoc import document

SCHEMA = "known"


def entry_text(e: Entry) -> str:
    lines = [f"{e.id}  ({e.kind})", f"  {e.title}", ""]
    if e.kind == "issue":
        sig = "rules " + ", ".join(e.rules)
        if e.pattern is not None:
            sig += f"; text matching /{e.pattern.pattern}/"
        if e.versions:
            sig += "; reported on " + ", ".join(f"{k} {v}" for k, v in e.versions.items())
        if e.gpus:
            sig += "; GPUs " + ", ".join(e.gpus)
        lines += [f"Signature: {sig}", ""]
    lines += [f"What it means: {e.meaning}", ""]
    for label, value in (("What upstream said", e.maintainers), ("Evidence", e.evidence), ("Caveats", e.caveats),
                         ("Workaround", e.workaround), ("Fixed in", e.fixed_in)):
        if value:
            lines += [f"{label}: {value}", ""]
    lines.append(f"Upstream: {e.url}")
    lines += [f"Related: {u}" for u in e.related]
    return "\n".join(lines) + "\n"


def listing(entries: list[Entry]) -> str:
    width = max((len(e.id) for e in entries), default=0)
    return "".join(f"{e.id:{width}}  {'alt ' if e.kind == 'alternative' else ''}{e.title}\n" for e in entries)


def as_document(query: str | None, entries: list[Entry], total: int) -> dict[str, Any]:
    return document(SCHEMA, {"query": query, "total": total, "count": len(entries),
                             "entries": [e.to_dict() for e in entries]})
