"""Writes known_issues.json from known_issues.toml (the same document, with the TOML's sha256), after checking it.

Run after editing the catalog: `python -m gpuwarden.ops.knowledge.build`; tests/integration/ops/knowledge/test_known_issues.py fails when
the JSON is stale. The JSON only makes loading fast; the TOML stays the source.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib

from gpuwarden.ops.knowledge.catalog import COMPILED, DATA, _here, from_document


def build() -> str:
    text = (_here() / DATA).read_bytes()
    doc = tomllib.loads(text.decode("utf-8"))
    from_document(doc, compile_patterns=True)  # refuse to write a catalog that does not load
    out = {"toml_sha256": hashlib.sha256(text).hexdigest(), "generated_from": DATA, **doc}
    return json.dumps(out, indent=1, ensure_ascii=False, sort_keys=False) + "\n"


def main() -> int:
    (_here() / COMPILED).write_text(build(), encoding="utf-8")
    print(f"wrote {_here() / COMPILED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
