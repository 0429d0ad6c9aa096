"""`gpuwarden serve` in headless Chromium (Debian's): the console draws in the page, a key press reaches it,
the token guards anything beyond loopback, and consoles are read-only unless actions are allowed."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.net import free_port
from helpers.simnode import wait_for

CHROMIUM = "/usr/bin/chromium"
# Each visit starts a whole console (about 4 s on a loaded 2-core box): the suite makes 6, the 20-visit
# run is GPUWARDEN_SERVE_CYCLES=20 (tests/bench/RESULTS.md has its figures).
CYCLES = int(os.environ.get("GPUWARDEN_SERVE_CYCLES") or 6)
pytestmark = [pytest.mark.timeout(60 + 6 * CYCLES),
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed (tests/run-all.sh installs it)")]


def http_status(url: str, cookie: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture
def served(tmp_path):
    """Start `gpuwarden serve` on a free loopback port over a sim node; yields (base URL, process, extra args)."""
    procs = []

    def start(*extra: str) -> str:
        state = tmp_path / "state"
        if not state.exists():
            subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim", "sim",
                            "init", "--gpus", "2", "--vram", "8GiB"], check=True, capture_output=True, cwd=REPO)
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim",
                                 "serve", "--listen", f"127.0.0.1:{port}", *extra], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"serve-{port}.log", "wb"),
                                start_new_session=True)
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_status(base + "/static/css/xterm.css") == 200, timeout=30, what="serve to answer")
        return base
    yield start
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


class Browser:
    """Headless Chromium driven over the DevTools protocol (one page)."""

    def __init__(self, profile: Path):
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1280,800", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + 30
        self.devtools = None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                self.devtools = m.group(1)
                break
        assert self.devtools, "chromium did not open its DevTools port"
        port = re.search(r":(\d+)/", self.devtools).group(1)
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5))
        self.page = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self.ids = 0

    async def session(self):
        import aiohttp
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(self.page, max_msg_size=0)
        return self

    async def call(self, method: str, **params):
        self.ids += 1
        await self.ws.send_json({"id": self.ids, "method": method, "params": params})
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == self.ids:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def js(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def until(self, expression: str, timeout: float = 40.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.js(expression):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{expression} never became true")

    async def key(self, key: str) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, text=key if kind == "keyDown" else "")

    async def close(self) -> None:
        await self.ws.close()
        await self.http.close()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def console_pids(base_pid: int) -> list[int]:
    """The served console processes (children of the serve process)."""
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(base_pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if " tui" in line]


@pytest.mark.slow
async def test_console_in_chromium_screenshot_and_key(served, tmp_path):
    base = served()
    serve_pid = int(subprocess.run(["pgrep", "-f", f"serve --listen {base[7:]}"], capture_output=True,
                                   text=True).stdout.split()[0])
    browser = await Browser(tmp_path / "profile").session()
    try:
        await browser.call("Page.enable")
        await browser.call("Page.navigate", url=base + "/")
        await browser.until("document.body.classList.contains('-first-byte')")  # the console is drawing
        pids = wait_for(lambda: console_pids(serve_pid), what="the served console process")
        cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert cmdline.rstrip().endswith(" tui --read-only"), cmdline  # no --allow-actions: it cannot act
        png = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a drawn console is a much larger PNG than the dark page before it
            png = base64.b64decode((await browser.call("Page.captureScreenshot", format="png"))["data"])
            if len(png) > 20_000:
                break
            await asyncio.sleep(0.2)
        assert png.startswith(b"\x89PNG") and len(png) > 20_000, len(png)
        (tmp_path / "serve.png").write_bytes(png)
        if os.environ.get("GPUWARDEN_KEEP_SCREENSHOT"):
            shutil.copy(tmp_path / "serve.png", os.environ["GPUWARDEN_KEEP_SCREENSHOT"])
        await browser.js("document.querySelector('.xterm-helper-textarea').focus()")
        await browser.key("q")  # quit: the console exits and the page says the session ended
        await browser.until("document.body.classList.contains('-closed')")
        wait_for(lambda: not console_pids(serve_pid), what="the served console to exit")
    finally:
        await browser.close()


def test_token_is_required_when_given_and_off_loopback(served):
    base = served("--token", "s3cret-token-for-the-test")
    assert http_status(base + "/") == 403
    assert http_status(base + "/?token=wrong-token-wrong-token") == 403
    assert http_status(base + "/?token=s3cret-token-for-the-test") == 200
    assert http_status(base + "/", cookie="gpuwarden_token=s3cret-token-for-the-test") == 200
    assert http_status(base + "/ws") == 403  # the websocket too


def test_listen_beyond_loopback_makes_a_token_and_actions_need_a_flag():
    from gpuwarden.tui.serve import is_loopback, parse_listen, served_command
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
    assert parse_listen("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert served_command([], fleet_args=None, allow_actions=False).endswith("tui --read-only")
    assert "--read-only" not in served_command([], fleet_args=["--nodelist", "gpu1"], allow_actions=True)
    proc = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "serve", "--listen", "nowhere"], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 2 and "HOST:PORT" in proc.stderr


def consoles_of(state: Path) -> list[int]:
    """Every live served console of this test's node, wherever it was reparented to (zombies are gone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state_letter = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(state).encode() in args and b"tui" in args and b"serve" not in args and state_letter != "Z":
            found.append(int(entry.name))
    return found


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_pid_of(base: str) -> int:
    return int(subprocess.run(["pgrep", "-f", f"serve --listen {base[7:]}"], capture_output=True,
                              text=True).stdout.split()[0])


async def open_session(browser: Browser, base: str) -> None:
    await browser.call("Page.navigate", url=base + "/")
    await browser.until("document.body.classList.contains('-first-byte')")  # its console is drawing


@pytest.mark.slow
async def test_sessions_leave_no_console_and_serve_idles(served, tmp_path):
    """Issue 25 item 4: CYCLES visits, each page left for another (Chromium keeps such a page, websocket open, in its
    back/forward cache), then a browser killed with its session open, then serve stopped with one open."""
    base = served()
    state = tmp_path / "state"
    serve_pid = serve_pid_of(base)
    browser = await Browser(tmp_path / "profile").session()
    try:
        await browser.call("Page.enable")
        for _ in range(CYCLES):
            await open_session(browser, base)
            await browser.call("Page.navigate", url="about:blank")
        wait_for(lambda: not consoles_of(state), 20, "every session's console to end")
        # serve idles again: its CPU time over a 2 s measuring window (a window, not a wait for a condition)
        before, t0 = cpu_seconds(serve_pid), time.monotonic()
        await asyncio.sleep(2.0)
        share = (cpu_seconds(serve_pid) - before) / (time.monotonic() - t0)
        print(f"serve CPU after {CYCLES} sessions: {share:.1%} of a core")
        assert share < 0.05, share
        await open_session(browser, base)
        assert consoles_of(state)
    finally:
        await browser.close()  # SIGKILL: the browser goes with a session open
    wait_for(lambda: not consoles_of(state), 20, "the console of a browser that went to end")
    other = await Browser(tmp_path / "profile2").session()
    try:
        await open_session(other, base)
        assert consoles_of(state)
        t0 = time.monotonic()
        os.kill(serve_pid, signal.SIGTERM)
        wait_for(lambda: subprocess.run(["ps", "-o", "stat=", "-p", str(serve_pid)], capture_output=True,
                                        text=True).stdout.strip()[:1] in ("", "Z"), 15, "serve to exit")
        print(f"serve exited {time.monotonic() - t0:.1f} s after SIGTERM with a session open")
        assert not consoles_of(state)  # serve ended it before it exited
    finally:
        await other.close()


async def test_a_console_does_not_outlive_a_killed_serve(served, tmp_path):
    """serve SIGKILLed (no cleanup of its own): its session's console dies too (PR_SET_PDEATHSIG), and it ran
    without a shell between them (serve holds the console's own pid, leading its own process group)."""
    base = served()
    state = tmp_path / "state"
    serve_pid = serve_pid_of(base)
    browser = await Browser(tmp_path / "profile").session()
    try:
        await open_session(browser, base)
        pids = wait_for(lambda: consoles_of(state), what="the served console")
        stat = Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) == serve_pid and int(stat[2]) == pids[0], stat[:3]  # parent serve; own group
        os.kill(serve_pid, signal.SIGKILL)
        wait_for(lambda: not consoles_of(state), 10, "the console to end with serve")
    finally:
        await browser.close()


def test_a_served_console_ends_at_end_of_input(tmp_path):
    """Textual's web driver stops reading at end of input and leaves the app running; ours ends it (no 'quit'
    packet: serve died, or closed the pipe)."""
    from gpuwarden.tui.serve import DRIVER
    state = tmp_path / "state"
    subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim", "sim",
                    "init", "--gpus", "1"], check=True, capture_output=True, cwd=REPO)
    console = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state), "--backend", "sim",
                                "tui", "--read-only"], cwd=REPO, env={**os.environ, "TEXTUAL_DRIVER": DRIVER},
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert console.stdout.readline() == b"__GANGLION__\n"  # the web driver is up and reading
        console.stdin.close()
        assert console.wait(20) == 0
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()
