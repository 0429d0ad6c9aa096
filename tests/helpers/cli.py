"""Shared pytest fixtures: a private state dir, the captured fixtures, and running the real CLI.

Tests run the installed `gpuwarden` in subprocesses where behaviour at the process boundary matters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from helpers.paths import REPO


def wheel_build_module():
    """deploy/wheel/build.py (the wheels' and the image's build script), imported once."""
    if "build" not in sys.modules:
        sys.path.insert(0, str(REPO / "deploy" / "wheel"))
    import build
    assert Path(build.__file__).resolve() == REPO / "deploy" / "wheel" / "build.py", build.__file__
    return build


def gpuwarden(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
              input: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process (stdin not a terminal), return the completed process."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("GPUWARDEN_BACKEND", None) if env is not None and "GPUWARDEN_BACKEND" not in env else None
    proc = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", *args], env=full_env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          input=input if input is not None else "")
    if check and proc.returncode != 0:
        raise AssertionError(f"gpuwarden {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc
