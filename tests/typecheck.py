"""mypy --strict over gpuwarden.ops, .playbooks and .tui as a ratchet: no module may have more findings than tests/mypy-baseline.json
records, and a module that got cleaner lowers its number (run with --update to write the new baseline).

The repository's top level is the gpuwarden package (pyproject maps it), so mypy reads it through a link named
gpuwarden under build/typecheck. Exit 0 when nothing got worse; 1 with the modules that did.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "tests" / "mypy-baseline.json"
PACKAGES = ("gpuwarden.ops", "gpuwarden.playbooks", "gpuwarden.tui")
FINDING = re.compile(r"^gpuwarden/(?P<path>[^:]+\.py):\d+: error:")


def findings() -> tuple[Counter, str]:
    root = REPO / "build" / "typecheck"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "gpuwarden"
    if not link.is_symlink():
        link.symlink_to(REPO, target_is_directory=True)
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(REPO / "pyproject.toml"),
                           "--cache-dir", str(root / "cache"), *(a for p in PACKAGES for a in ("-p", p))],
                          cwd=root, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"mypy itself failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return Counter(m["path"] for m in map(FINDING.match, proc.stdout.splitlines()) if m), proc.stdout


def main(argv: list[str]) -> int:
    counts, report = findings()
    if "--update" in argv:
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
        print(f"mypy baseline: {sum(counts.values())} findings in {len(counts)} modules written to {BASELINE}")
        return 0
    baseline = json.loads(BASELINE.read_text())
    worse = {p: (baseline.get(p, 0), n) for p, n in counts.items() if n > baseline.get(p, 0)}
    better = {p: (n, counts.get(p, 0)) for p, n in baseline.items() if counts.get(p, 0) < n}
    print(f"mypy --strict {', '.join(PACKAGES)}: {sum(counts.values())} findings in {len(counts)} modules "
          f"(baseline {sum(baseline.values())} in {len(baseline)})")
    if better:
        print(f"  cleaner than the baseline: {len(better)} module(s); run `python tests/typecheck.py --update`")
    if worse:
        for path, (was, now) in sorted(worse.items()):
            print(f"  worse: {path}: {was} -> {now}")
        print("\n".join(line for line in report.splitlines()
                        if any(line.startswith(f"gpuwarden/{p}:") for p in worse)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
