"""What several test files share with test_tui_terminal.py: GPUWARDEN, Tmux, pytestmark.

Taken out of test_tui_terminal.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
import pytest


pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (tests/run-all.sh installs it)")]


GPUWARDEN = Path(sys.executable).parent / "gpuwarden"


class Tmux:
    def __init__(self, socket: Path, name: str = "gw"):
        self.base = ["tmux", "-S", str(socket)]
        self.config_home = socket.parent / "xdg-config"
        self.name = name

    def start(self, command: str, width: int = 100, height: int = 30, env: dict | None = None) -> None:
        args = [*self.base, "new-session", "-d", "-x", str(width), "-y", str(height), "-s", self.name]
        # The console's remembered settings (tui/prefs.py) of whoever runs the tests must not apply here.
        env = {"XDG_CONFIG_HOME": str(self.config_home), **(env or {})}
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        subprocess.run([*args, command], check=True)

    def screen(self, escapes: bool = False) -> str:
        out = subprocess.run([*self.base, "capture-pane", "-p", *(["-e"] if escapes else []), "-t", self.name],
                             capture_output=True, text=True)
        return out.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", self.name, *keys], check=True)

    def wait_screen(self, needle: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if needle in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never appeared on the screen:\n{text}")

    def wait_gone(self, needle: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        text = self.screen()
        while needle in text:
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} is still on the screen:\n{text}")
            time.sleep(0.1)
            text = self.screen()
        return text

    def kill(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)
