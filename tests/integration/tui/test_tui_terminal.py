"""The installed `gpuwarden tui` in a real terminal (tmux): it draws the sim node, answers keys, quits, and
leaves cleanly when its terminal goes away (SIGHUP, as when an SSH session drops).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.sleepers import sleeps_by_thread
from helpers.tui_terminal import GPUWARDEN, Tmux
from helpers.tui_terminal import pytestmark  # noqa: F401  (fixtures and marks: pytest finds them by name)

# Runs gpuwarden as its child with SIGHUP at its default, records the exit status; survives the hangup itself.
WRAPPER = r"""
import os, signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_IGN)
proc = subprocess.Popen(sys.argv[2:], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
open(sys.argv[1] + ".pid", "w").write(str(proc.pid))
rc = proc.wait()
open(sys.argv[1] + ".tmp", "w").write(str(rc))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


@pytest.fixture
def sim_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    subprocess.run([str(GPUWARDEN), "--state-dir", str(state), "sim", "init", "--gpus", "4", "--vram", "24GiB"],
                   check=True, capture_output=True)
    return state


@pytest.fixture
def tmux(tmp_path: Path):
    t = Tmux(tmp_path / "tmux.sock")
    yield t
    t.kill()


def wait_file(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_tui_in_a_real_terminal_draws_answers_keys_and_quits(sim_state, tmux, tmp_path):
    assert GPUWARDEN.exists(), f"{GPUWARDEN} is not installed"
    rc = tmp_path / "rc"
    tmux.start(f"{GPUWARDEN} --state-dir {sim_state} --backend sim tui --refresh 0.5; echo exit=$? > {rc}; sleep 60")
    text = tmux.wait_screen("SIMULATED")
    tmux.wait_screen("0.0/24G")
    assert "every 0.5s" in text and "GPUs" in tmux.screen() and "Engines" in tmux.screen()
    tmux.keys("?")
    tmux.wait_screen("WHAT IT DOES")
    assert "Drain GPU" in tmux.screen()
    tmux.keys("Escape")
    tmux.wait_gone("WHAT IT DOES")  # a lone Esc is held back a moment: the next key must not join it
    tmux.keys("Enter")  # GPU 0's detail view
    tmux.wait_screen("Processes on this GPU")
    tmux.keys("Escape")
    tmux.wait_screen("Engines")
    tmux.keys("q")
    assert wait_file(rc, 15).strip() == "exit=0"
    after = tmux.screen()
    assert "Traceback" not in after and "Error" not in after


def test_tui_read_only_in_a_real_terminal_has_no_action_keys(sim_state, tmux, tmp_path):
    rc = tmp_path / "rc"
    tmux.start(f"{GPUWARDEN} --state-dir {sim_state} --backend sim tui --read-only; echo exit=$? > {rc}; sleep 60",
               width=80, height=24)
    tmux.wait_screen("READ-ONLY")
    # A frame reaches tmux in pieces: wait for the key strip itself, not just for the header above it.
    text = tmux.wait_screen("Quit")
    footer = next(line for line in text.splitlines() if "Quit" in line)
    assert " d " not in footer and " R " not in footer, footer
    # Keys are handled in order: once the help that "?" opens is up, "d" has had its chance to act.
    tmux.keys("d", "?")
    text = tmux.wait_screen("WHAT IT DOES")
    assert "Proceed" not in text and "Drain GPU" not in text and "read-only" in text
    tmux.keys("Escape")
    tmux.wait_gone("WHAT IT DOES")
    tmux.keys("q")
    assert wait_file(rc, 15).strip() == "exit=0"


# xterm-256 colours that are greys: the basic black/white/greys, the cube's diagonal and the grey ramp.
GREYS = {0, 7, 8, 15, 16, 59, 102, 145, 188, 231, *range(232, 256)}


def sgr(screen: str) -> tuple[set[int], set[str]]:
    """The 256-colour indexes and the other attributes (1 bold, 7 reverse, ...) of every SGR sequence."""
    import re
    colours, attrs = set(), set()
    for params in re.findall(r"\x1b\[([0-9;]*)m", screen):
        parts, i = params.split(";"), 0
        while i < len(parts):
            if parts[i] in ("38", "48") and i + 2 < len(parts) and parts[i + 1] == "5":
                colours.add(int(parts[i + 2]))
                i += 3
            elif parts[i] in ("38", "48") and i + 1 < len(parts) and parts[i + 1] == "2":
                i += 5
            else:
                attrs.add(parts[i])
                i += 1
    return colours, attrs


@pytest.mark.parametrize("no_color", [False, True])
def test_no_color_leaves_only_greys_and_keeps_the_highlights(sim_state, tmux, tmp_path, no_color):
    subprocess.run([str(GPUWARDEN), "--state-dir", str(sim_state), "sim", "leak", "--gpu", "1", "--size", "4GiB"],
                   check=True, capture_output=True)
    env = {"NO_COLOR": "1"} if no_color else {}
    tmux.start(f"{'NO_COLOR=1 ' if no_color else ''}{GPUWARDEN} --state-dir {sim_state} --backend sim tui; sleep 60",
               env=env)
    tmux.wait_screen("4.0G")
    screen = tmux.screen(escapes=True)
    used, _ = sgr(screen)
    if no_color:
        assert used <= GREYS, f"colours under NO_COLOR: {sorted(used - GREYS)}"
    else:
        assert used - GREYS, "the colour run should use colours (else this test proves nothing)"
    # The residual stays marked without colour: reverse video on its cell.
    line = next(ln for ln in screen.splitlines() if "4.0G" in ln)
    assert "7" in sgr(line.split("4.0G")[0][-60:])[1], line
    tmux.keys("q")


@pytest.mark.parametrize("how", ["sighup", "terminal-closed"])
def test_tui_exits_cleanly_when_the_terminal_goes_away(sim_state, tmux, tmp_path, how):
    rc = tmp_path / "rc"
    tmux.start(f"{sys.executable} -c '{WRAPPER}' {rc} {GPUWARDEN} --state-dir {sim_state} --backend sim tui"
               + ("; sleep 60" if how == "sighup" else ""))
    tmux.wait_screen("SIMULATED")
    pid = int(wait_file(Path(str(rc) + ".pid"), 5))
    if how == "sighup":
        os.kill(pid, signal.SIGHUP)
    else:
        tmux.kill()  # tmux closes the pty: the kernel hangs up the terminal and signals its processes
    code = int(wait_file(rc, 15))
    assert code == 0, f"exit status {code} (negative: killed by that signal)"
    if how == "sighup":
        after = tmux.screen()
        assert "Traceback" not in after, after


def test_tui_without_a_terminal_says_so_in_one_line(sim_state):
    proc = subprocess.run([str(GPUWARDEN), "--state-dir", str(sim_state), "--backend", "sim", "tui"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "needs a terminal" in proc.stderr and "Traceback" not in proc.stderr


def test_tui_refresh_below_the_floor_is_refused(sim_state):
    proc = subprocess.run([str(GPUWARDEN), "--state-dir", str(sim_state), "--backend", "sim", "tui",
                           "--refresh", "0.1"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "too fast" in proc.stderr and "Traceback" not in proc.stderr


def test_plain_gpuwarden_opens_the_console(sim_state, tmux, tmp_path):
    rc = tmp_path / "rc"
    tmux.start(f"{GPUWARDEN} --state-dir {sim_state} --backend sim; echo exit=$? > {rc}; sleep 60", width=80,
               height=24)
    tmux.wait_screen("SIMULATED")
    tmux.wait_screen("0.0/24G")
    tmux.keys("q")
    assert wait_file(rc, 15).strip() == "exit=0"


def test_an_open_console_at_80x24_follows_a_scenario_run_in_another_shell(sim_state, tmux, tmp_path):
    """The issue-24 report in a real terminal: the console open at 80x24 shows each key with its word, and
    `sim scenario residual` run in another shell shows up in it (it held the replaced files open before)."""
    rc = tmp_path / "rc"
    tmux.start(f"{GPUWARDEN} --state-dir {sim_state} --backend sim tui --refresh 0.5; echo exit=$? > {rc}; sleep 60",
               width=80, height=24)
    tmux.wait_screen("0.0/24Gi")
    strip = tmux.screen().rstrip("\n").splitlines()[-1].split()
    for word in ("quit", "Keys", "fix", "drain", "Reset", "Purge", "kill", "Info"):
        assert word in strip, strip
    proc = subprocess.run([str(GPUWARDEN), "--state-dir", str(sim_state), "--backend", "sim", "sim", "scenario",
                           "residual"], capture_output=True, text=True, timeout=60)
    try:
        assert proc.returncode == 0, proc.stderr
        tmux.wait_screen("14.0/24Gi")
        tmux.keys("q")
        assert wait_file(rc, 15).strip() == "exit=0"
    finally:
        subprocess.run([str(GPUWARDEN), "--state-dir", str(sim_state), "--backend", "sim", "sim", "scenario", "clean"],
                       capture_output=True, timeout=60)


def test_the_idle_consoles_input_thread_sleeps_until_a_key(sim_state, tmux, tmp_path):
    # Textual's own input thread woke ten times a second to look for its exit flag: 1.5 ms of CPU a second in an
    # idle console, more than its drawing (issue 38). Absence of wake-ups can only be seen over a window.
    status = tmp_path / "rc"
    tmux.start(f"{sys.executable} -c '{WRAPPER}' {status} {GPUWARDEN} --state-dir {sim_state} --backend sim tui")
    tmux.wait_screen("0.0/24G")
    pid = int(wait_file(Path(f"{status}.pid"), 15))
    before = sleeps_by_thread(pid)
    assert any(k.startswith("textual-input/") for k in before), sorted(before)
    time.sleep(1.5)  # fifteen wake-ups of Textual's own thread
    after = sleeps_by_thread(pid)
    woke = {k: after[k] - v for k, v in before.items() if k in after and k.startswith("textual-input/")}
    assert all(n <= 1 for n in woke.values()), woke
    # It still wakes for keys at once, a lone Esc included (the parser's timeout is the one it sleeps to).
    tmux.keys("?")
    tmux.wait_screen("WHAT IT DOES")
    tmux.keys("Escape")
    tmux.wait_gone("WHAT IT DOES")
    tmux.keys("q")
    assert wait_file(status, 15).strip() == "0"


def test_the_installed_textual_is_one_the_quiet_driver_was_read_against():
    # A Textual upgrade falls back to Textual's own driver (correct, ten wake-ups a second) until someone reads its
    # LinuxDriver.run_input_thread again and adds the release to TEXTUAL_READ: this says when that is due.
    import textual
    from gpuwarden.tui import terminal_driver
    assert terminal_driver.fits(), (f"Textual {textual.__version__} is not in terminal_driver.TEXTUAL_READ "
                                    f"{terminal_driver.TEXTUAL_READ}: read its input thread, then add it")


def test_a_console_stopped_and_continued_from_the_shell_still_answers_keys(sim_state, tmux, tmp_path):
    # SIGTSTP stops the input thread (the quiet driver's wake pipe) and `fg` starts a new one: exactly one reads
    # the keys afterwards, and it still sleeps between them.
    tmux.start("bash --norc --noprofile", width=120, height=40)
    tmux.keys(f"{GPUWARDEN} --state-dir {sim_state} --backend sim tui", "Enter")
    tmux.wait_screen("0.0/24G")
    out = subprocess.run(["pgrep", "-f", f"state-dir {sim_state} --backend sim tui"], capture_output=True, text=True)
    pid = int(out.stdout.split()[0])
    os.kill(pid, signal.SIGTSTP)
    tmux.wait_screen("Stopped")
    tmux.keys("fg", "Enter")
    deadline = time.monotonic() + 30
    while "WHAT IT DOES" not in tmux.screen():  # Textual redraws after a resume in its own time: ask until it answers
        assert time.monotonic() < deadline, tmux.screen()
        tmux.keys("?")
        time.sleep(0.3)
    tmux.keys("Escape")
    tmux.wait_gone("WHAT IT DOES")
    before = sleeps_by_thread(pid)
    inputs = [k for k in before if k.startswith("textual-input/")]
    assert len(inputs) == 1, sorted(before)
    time.sleep(1.0)  # ten wake-ups of Textual's own thread
    assert sleeps_by_thread(pid)[inputs[0]] - before[inputs[0]] <= 1
    tmux.keys("q")
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the console did not quit after fg"
