"""The interposer's Python side without engines: config keys, registration records, the build's one-line error."""

from __future__ import annotations

import os
import subprocess
import sys


from helpers.paths import REPO


def test_install_without_a_c_compiler_leaves_out_the_interposer_with_one_line(tmp_path):
    # Issue 23 changed this from failing the install: everything else works without the interposer.
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path),
                           "--build-temp", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "CC": "no-such-cc"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: no C compiler")]
    assert len(warnings) == 1 and "manylinux wheel" in warnings[0] and "install gcc" in warnings[0], proc.stderr
    assert not list(tmp_path.rglob("libgwpreload.so"))
    assert "Traceback" not in proc.stderr
