"""tests/README.md's map from module to tests stays true: a test file added or renamed without regenerating the
map fails here (`python tests/testmap.py` rewrites it)."""

from __future__ import annotations

import subprocess
import sys

from helpers.paths import REPO


def test_the_module_to_tests_map_is_current():
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "testmap.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
