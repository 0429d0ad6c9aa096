"""Writes tests/README.md: where the tests are, and for each part of gpuwarden the test files that import it.

    python tests/testmap.py            # rewrite the map
    python tests/testmap.py --check    # exit 1 when the map is out of date (a test file added, renamed or
                                       # importing something new)

A part is a top-level module or package of ops/, playbooks/ or tui/ (ops/sampling, playbooks/purge, tui/app).
Only direct imports count: an end-to-end file that runs the CLI covers more than its row says.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MAP = TESTS / "README.md"

HEADER = """\
# The tests: where to look

Run everything with `bash tests/run-all.sh` (the README's test command: installs what the suite needs, runs
ruff, the mypy ratchet and pytest); the unit tier alone with `.venv/bin/python -m pytest -n 2 tests/unit`.

Two tiers, each in folders that mirror the packages (`ops/agent`, `playbooks/cli`, `tui`; `project` for checks of
the whole repository: docs, layers, packaging, hardening):
- `unit/` runs in the pytest process: no child process, socket or server (`unit/conftest.py` refuses them, so a
  test that needs one says so at once), each file in seconds; the tier takes under a minute on two cores.
- `integration/` runs the real CLI, agents, engines, sshd, Prometheus, tmux and Chromium.

Fixtures are in `conftest.py` (one per meaning: `state_dir`, `cli`, `sim_state`, `sim_cli`, `sim_settings`,
`real_hip`, `fixtures` for the captured outputs in `fixtures/`, provenance in `fixtures/SOURCES.md`); code that
several test files share in `helpers/` (test files never import one another; `helpers/paths.py` has REPO and
TESTS); stand-ins for what cannot run here (amdsmi, NVML, the Kubernetes API) in `standins/`; fake and crashing
engines in `engines/`; benchmarks in `bench/` (not in the default run, results in `bench/RESULTS.md`); device
scripts for the lent H200 in `device/`.

A file named after a module tests that module (`test_nodeconfig`, `test_sampling_attribution` for
sampling/attribution); the others are named for the behaviour they prove end to end (`test_cli_friction`,
`test_harden_signals`). Many tests run the real CLI in a subprocess: the table lists what a file imports (itself
or through the helpers it uses), so an end-to-end file covers more than its row says. This file is written by
`python tests/testmap.py`.

| part | tests that import it |
| --- | --- |
"""


def imported_parts(path: Path) -> set[str]:
    """The parts (ops/x, playbooks/y, tui/z) a test file imports, by name."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuwarden."):
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("gpuwarden.")]
        else:
            continue
        for name in names:
            bits = name.split(".")
            if len(bits) < 3:
                continue
            part = "/".join(bits[1:3])
            if (REPO / part).is_dir() or (REPO / f"{part}.py").is_file():
                parts.add(part)
    return parts


def helpers_used(path: Path) -> list[Path]:
    """The tests/helpers modules a test file imports (`from helpers.x import y`, `from helpers import x`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "helpers":
            found += [TESTS / "helpers" / f"{a.name}.py" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers."):
            found.append(TESTS / "helpers" / f"{node.module.split('.')[1]}.py")
    return [p for p in found if p.is_file()]


def render() -> str:
    by_part: dict[str, set[str]] = defaultdict(set)
    for path in sorted(p for tier in ("unit", "integration") for p in TESTS.glob(f"{tier}/**/test_*.py")):
        for part in imported_parts(path).union(*(imported_parts(h) for h in helpers_used(path))):
            by_part[part].add(path.stem)
    rows = [f"| `{part}` | " + ", ".join(f"`{t}`" for t in sorted(tests)) + " |" for part, tests in
            sorted(by_part.items())]
    return HEADER + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if MAP.read_text() != text:
            print(f"{MAP} is out of date: run `python tests/testmap.py`", file=sys.stderr)
            return 1
        return 0
    MAP.write_text(text)
    print(f"wrote {MAP} ({text.count(chr(10)) - HEADER.count(chr(10))} parts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
