"""The manual builds (`mkdocs build --strict`: every page in the nav, no broken link or anchor), the README stays
a front door (at most 250 lines, the two commands exactly), and nothing in the repository points outside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

FIRST = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/gpuwarden"
SECOND = "bash tests/run-all.sh"


def test_the_manual_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.fail("mkdocs is missing: it comes with the docs extra, part of test (pip install -e '.[test]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    for page in ("index.html", "install/index.html", "agent/index.html", "state-dir/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    lines = [line.strip() for line in text.splitlines()]
    assert FIRST in lines and SECOND in lines
    assert SECOND in (REPO / ".ci/run").read_text()  # what CI runs is what the README says it runs
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link


def test_nothing_points_outside_the_repository():
    # Spelled in two parts so that this file, which looks for it, does not contain it.
    OUTSIDE = "/".join(("..", "shared"))  # a call, not a literal Python folds into one string in the .pyc
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    offenders = []
    for name in tracked.stdout.split("\0"):
        path = REPO / name
        if not name or not path.is_file() or path.suffix not in (".py", ".md", ".toml", ".yml", ".yaml", ".sh", ""):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if OUTSIDE in text:
            offenders.append(name)
    assert not offenders, offenders


def test_the_doctor_page_counts_the_checks_there_are():
    # docs/doctor.md said 27 while doctor ran 29 (issue 36): the number and the groups are held to the registry.
    from gpuwarden.ops.doctor.checks import REGISTRY
    text = (REPO / "docs/doctor.md").read_text()
    (count,) = re.findall(r"(\d+) small named checks", text)
    assert int(count) == len(list(REGISTRY))
    groups = set(re.findall(r"^\| (\w+) \|", text, re.M)) - {"group"}
    assert groups == {c.group for c in REGISTRY}
