"""ops/foundation/paths.py: the default state dir's check and the PYTHONPATH a Python child of gpuwarden gets.

The children (the engine shim, the sim drill's helpers, the probe's canaries) must import this very gpuwarden
and never expose its ops/, tui/, playbooks/ folders as top-level names (they would shadow PyPI's projects).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuwarden.ops.foundation.paths import child_pythonpath
from helpers.paths import REPO



def _exposes_our_folders(entry: str) -> bool:
    return (Path(entry) / "ops" / "paths.py").exists() or (Path(entry) / "tui" / "app.py").exists()


def test_from_a_checkout_the_child_needs_no_path_and_gets_none():
    env = child_pythonpath({"PYTHONPATH": "/somewhere"})
    # The editable install's finder serves the child; the caller's own entries stay, ours are not added.
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == "/somewhere"
    assert not any(_exposes_our_folders(e) for e in env["PYTHONPATH"].split(os.pathsep))


def test_a_package_found_through_a_folder_puts_that_folder_first_not_the_package(tmp_path):
    # A link named gpuwarden (as tests/device/setup.sh makes on a lent machine) stands for an installed package.
    (tmp_path / "gpuwarden").symlink_to(REPO)
    code = ("import json, gpuwarden.ops.foundation.paths as p; "
            "print(json.dumps([p.__file__, p.child_pythonpath({'PYTHONPATH': '/theirs'})['PYTHONPATH']]))")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          cwd="/", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    where, path = json.loads(proc.stdout)
    assert where.startswith(str(tmp_path)), where
    assert path.split(os.pathsep) == [str(tmp_path), "/theirs"]
    assert not any(_exposes_our_folders(e) for e in path.split(os.pathsep))
