"""JSON documents gpuwarden prints or serves: each names its schema and version, times come in ISO-8601 too.

The schemas are published in ops/schemas/<name>.json; tests validate every `--json` output against them.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
PREFIX = "gpuwarden."


def schema_id(name: str, version: int = 1) -> str:
    """`gpuwarden.<name>/<version>`: the value of a document's "schema" key."""
    return f"{PREFIX}{name}/{version}"


def iso(ts: float | None) -> str | None:
    """Seconds since the epoch as ISO-8601 UTC with milliseconds (`2026-12-01T09:18:02.123Z`)."""
    if ts is None:
        return None
    # time.gmtime rather than datetime: `status` imports this, and datetime costs more than the whole call.
    whole = int(ts // 1)
    ms = min(999, int((ts - whole) * 1000))  # truncated, as isoformat(timespec="milliseconds") does
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def document(name: str, body: dict[str, Any], version: int = 1) -> dict[str, Any]:
    """`body` with its schema id first (a key "schema" already in body is replaced)."""
    return {"schema": schema_id(name, version), **{k: v for k, v in body.items() if k != "schema"}}


def error_document(message: str, hint: str | None, exit_code: int) -> dict[str, Any]:
    """What a command run with --json prints on stdout instead of its result when it fails."""
    return document("error", {"error": message, "hint": hint, "exit_code": exit_code})


def dumps(doc: dict[str, Any], indent: int | None = 2) -> str:
    return json.dumps(doc, indent=indent, default=str)


def schema_file(schema: str) -> Path:
    """The published schema file for a "schema" value such as gpuwarden.snapshot/1."""
    if not schema.startswith(PREFIX) or "/" not in schema:
        raise ValueError(f"not a gpuwarden schema id: {schema!r}")
    name, _, version = schema[len(PREFIX):].partition("/")
    return SCHEMA_DIR / f"{name}.v{version}.json"


@lru_cache(maxsize=None)
def load_schema(schema: str) -> dict[str, Any]:
    return json.loads(schema_file(schema).read_text())


def validate(doc: Any) -> None:
    """Raise ValueError naming the first place where `doc` breaks the schema it names."""
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
        raise ValueError("not a gpuwarden document: no \"schema\" key")
    try:
        schema = load_schema(doc["schema"])
    except FileNotFoundError:
        raise ValueError(f"unknown schema {doc['schema']!r} (no {schema_file(doc['schema']).name})") from None
    import jsonschema  # only the tests and the readers of foreign files pay for it
    cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(doc))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top)"
        raise ValueError(f"{doc['schema']}: at {where}: {error.message}")
