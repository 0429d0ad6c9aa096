"""Issue 36's console fixes in a real terminal (tmux) at 80x24 and 100x30, on the simulated node's residual
incident: the remembered stacked layout keeps every panel on the screen, the "!" is said, the holder is
bracketed once, the key list fits, and a drain from the Processes panel asks about that process's GPU with
nothing behind the dialog offering to stop it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from helpers.tui_terminal import GPUWARDEN, Tmux, pytestmark  # noqa: F401  (tmux present, the time limit)


@pytest.fixture
def residual_node(tmp_path: Path):
    state = tmp_path / "state"
    base = [str(GPUWARDEN), "--state-dir", str(state), "--backend", "sim"]
    subprocess.run([*base, "sim", "scenario", "residual"], check=True, capture_output=True, timeout=60)
    yield state
    subprocess.run([*base, "sim", "scenario", "clean"], capture_output=True, timeout=60)


def panel_rows(screen: str, title: str) -> list[str]:
    """The lines of the panel whose top border carries `title`, borders included."""
    lines = screen.splitlines()
    top = next(i for i, line in enumerate(lines) if f"─ {title} " in line)
    column = lines[top].index(f"─ {title} ") - 1
    end = next(i for i in range(top + 1, len(lines)) if lines[i][column:column + 1] == "╰")
    return lines[top:end + 1]


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
def test_the_residual_incident_in_a_real_terminal(residual_node, tmp_path, size):
    width, height = size
    tmux = Tmux(tmp_path / "tmux.sock")
    (tmux.config_home / "gpuwarden").mkdir(parents=True)
    (tmux.config_home / "gpuwarden" / "tui.toml").write_text('layout = "stacked"\n')
    try:
        tmux.start(f"{GPUWARDEN} --state-dir {residual_node} --backend sim tui --refresh 0.5; sleep 60",
                   width=width, height=height,
                   env={"COLUMNS": str(width), "LINES": str(height)})  # the suite's own COLUMNS must not win
        screen = tmux.wait_screen("! residual")
        screen = tmux.wait_screen("zombie")  # the Processes panel drawn, with the holder
        lines = screen.splitlines()
        assert len(lines) <= height
        for title in ("GPUs", "Engines", "Processes", "Arena", "Events"):
            rows = panel_rows(screen, title)
            assert len(rows) >= 3, (title, screen)
        engines = panel_rows(screen, "Engines")
        assert "no engines supervised" in "\n".join(engines)
        assert len(engines) <= 6, screen  # the empty panel's sentence, not 14 blank rows

        # The holder's GPU view: the kernel's name bracketed once.
        tmux.keys("Down", "Enter")  # GPU 1
        detail = tmux.wait_screen("holder pid")
        assert "[[" not in detail and re.search(r"\[python3?[^\]]*\]", detail), detail
        tmux.keys("Escape")
        tmux.wait_screen("! residual")

        # The key list: as wide as the terminal (up to 120), its entries whole, the marks explained.
        tmux.keys("?")
        keys = tmux.wait_screen("WHAT IT DOES")
        box = next(line for line in keys.splitlines() if "WHAT IT DOES" in line)
        assert len(box.rstrip()) >= width - 4, keys
        for _ in range(10):  # to the end of the list, a page at a time, as its last line says
            tmux.keys("PageDown")
            try:
                tmux.wait_screen("residual VRAM above the tolerance", timeout=1.0)
                break
            except AssertionError:
                continue
        tmux.wait_screen("residual VRAM above the tolerance")
        tmux.keys("Escape")
        tmux.wait_gone("the list scrolls")

        # From the Processes panel, d means the selected process's GPU: the zombie's is GPU 1.
        tmux.keys("Tab")  # GPUs -> Engines
        tmux.keys("Tab")  # -> Processes
        procs = "\n".join(panel_rows(tmux.screen(), "Processes"))
        first_gpu = re.search(r"│\s+\d+\s+\S+\s+\S+\s+(\d+)\s", procs)
        assert first_gpu, procs
        tmux.keys("d")
        dialog = tmux.wait_screen("Proceed")
        assert f"Drain GPU {first_gpu.group(1)}" in dialog, dialog
        assert "Stop after this step" not in dialog, dialog
        tmux.keys("Escape")  # Cancel
        tmux.wait_gone("Proceed")
    finally:
        tmux.kill()
