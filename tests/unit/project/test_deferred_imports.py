"""Function-level imports in the package carry a '# deferred: <why>' comment (issue 37); a ratchet until all do.

The audit that says which ones pay for themselves: python tests/bench/audit_deferred.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# Imports inside functions without the comment as of the audit (tests/bench/RESULTS.md); may only go down.
UNCOMMENTED_AT_MOST = 195


def _uncommented() -> list[str]:
    out = []
    for pkg in ("ops", "playbooks", "tui", "deploy"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            seen = set()
            for fn in ast.walk(ast.parse(text)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in seen:
                        seen.add(node.lineno)
                        around = lines[node.lineno - 2:node.end_lineno or node.lineno]
                        if not any("# deferred:" in line for line in around):
                            out.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return out


def test_function_level_imports_without_a_deferred_comment_do_not_grow() -> None:
    found = _uncommented()
    assert len(found) <= UNCOMMENTED_AT_MOST, (
        f"{len(found)} imports inside functions lack '# deferred: <why>' (at most {UNCOMMENTED_AT_MOST}): hoist "
        f"them to the module top, or say which hot path they spare (tests/bench/audit_deferred.py): {found[-5:]}")
