"""Every import made inside a function in the package says why on its line or the line above: '# deferred: <why>'
(issue 37), the why not empty; what may move to its module's top is hoisted.

Why an import stays (the one convention): the measured path it keeps cheap and what it would cost there, an optional
extra, a vendor library, an import cycle, or a behaviour (an ImportError caught). The audit that prices them:
python tests/bench/audit_deferred.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# Imports inside functions without a '# deferred: <why>' comment: none since the audit of issue 37
# (tests/bench/RESULTS.md); a new one is hoisted or says why it stays.
UNCOMMENTED_AT_MOST = 0
_WHY = re.compile(r"# deferred:(.*)")


def undeclared(text: str) -> list[int]:
    """Lines of the imports inside functions in `text` with no '# deferred:' comment, or an empty one, on the
    import's lines or the line above."""
    lines = text.splitlines()
    out = []
    seen = set()
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in seen:
                seen.add(node.lineno)
                around = lines[max(node.lineno - 2, 0):node.end_lineno or node.lineno]
                whys = [m.group(1).strip() for line in around if (m := _WHY.search(line))]
                if not any(re.search(r"\w{2,}", why) for why in whys):
                    out.append(node.lineno)
    return out


def _uncommented() -> list[str]:
    out = []
    for pkg in ("ops", "playbooks", "tui", "deploy"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            out += [f"{path.relative_to(REPO)}:{n}" for n in undeclared(path.read_text())]
    return out


def test_function_level_imports_say_why_they_are_deferred() -> None:
    found = _uncommented()
    assert len(found) <= UNCOMMENTED_AT_MOST, (
        f"{len(found)} imports inside functions lack '# deferred: <why>' (at most {UNCOMMENTED_AT_MOST}): hoist "
        f"them to the module top, or say which hot path they spare (tests/bench/audit_deferred.py): {found[-5:]}")


def test_an_empty_or_missing_why_is_found() -> None:
    text = ("def f():\n"
            "    import json  # deferred:\n"
            "    # deferred:   \n"
            "    import os\n"
            "    import re\n"
            "    # deferred: keeps `gpuwarden status --json` cheap (2.5 ms there)\n"
            "    import socket\n"
            "    from shlex import (  # deferred: optional extra [fleet]\n"
            "        quote)\n")
    assert undeclared(text) == [2, 4, 5]
