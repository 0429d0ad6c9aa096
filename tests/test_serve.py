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

from conftest import REPO
from helpers.net import free_port
from simnode import wait_for

CHROMIUM = "/usr/bin/chromium"
pytestmark = [pytest.mark.timeout(120),
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
