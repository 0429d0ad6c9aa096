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

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
PREFIX = "gpuwarden."
# Nesting refused in a document read from outside (a bundle, a snapshot): gpuwarden's own go about 8 deep, and
# json's C parser recurses per level (100,000 nested arrays are a RecursionError, not a clean refusal).
MAX_DEPTH = 64
# Every byte but quotes and the four brackets, for bytes.translate(None, delete=...).
_NOT_SHAPE = bytes(b for b in range(256) if b not in b'"[]{}')


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


class TooDeep(ValueError):
    """A JSON document nested deeper than MAX_DEPTH (a ValueError: callers that refuse bad JSON refuse it too)."""


def nesting(data: bytes, stop: int = MAX_DEPTH) -> int:
    """How deep the arrays and objects of JSON text `data` nest, counting no further than `stop` + 1.

    All at C speed, no parse: escaped backslashes and quotes go first (pairs, leftmost first, as a parser
    reads them), then everything but quotes and brackets, then the strings (every other piece between
    quotes: their brackets are text); each pass after that deletes the innermost pairs, so a document d deep
    takes d passes and a hostile one at most stop + 1."""
    bare = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, delete=_NOT_SHAPE)
    shape = b"".join(bare.split(b'"')[::2]).replace(b"{", b"[").replace(b"}", b"]")
    depth = 0
    while shape and depth <= stop:
        thinner = shape.replace(b"[]", b"")
        if len(thinner) == len(shape):  # unbalanced: the parser will say where
            break
        shape, depth = thinner, depth + 1
    return depth


def loads(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """JSON that came from outside, nested at most `max_depth` deep; anything else raises ValueError
    (json.JSONDecodeError for bad text, TooDeep for nesting: the message says the limit)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if nesting(raw, max_depth) > max_depth:
        raise TooDeep(f"nested more than {max_depth} levels deep; gpuwarden writes about 8")
    try:
        return json.loads(raw)
    except RecursionError:  # not reachable below the limit, but never a traceback
        raise TooDeep(f"nested too deeply for the parser (limit {max_depth})") from None


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
    doc: dict[str, Any] = json.loads(schema_file(schema).read_text())  # a JSON Schema document: any JSON inside
    return doc


def validate(doc: Any) -> None:
    """Raise ValueError naming the first place where `doc` breaks the schema it names."""
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
        raise ValueError("not a gpuwarden document: no \"schema\" key")
    try:
        schema = load_schema(doc["schema"])
    except FileNotFoundError:
        raise ValueError(f"unknown schema {doc['schema']!r} (no {schema_file(doc['schema']).name})") from None
    # only the tests and the readers of foreign files pay for it
    # deferred: keeps `gpuwarden status --json` cheap (52.4 ms there)
    import jsonschema
    cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(doc))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top)"
        raise ValueError(f"{doc['schema']}: at {where}: {error.message}")
