"""Running a real `gpuwarden agent` for tests: start it with a real sd_notify socket, ask its API, stop it.

The agent is the installed program in a child process; READY=1 arrives on a datagram socket like systemd's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers.paths import REPO

from gpuwarden.ops.agent.client import get


class RunningAgent:
    def __init__(self, proc: subprocess.Popen, state_dir: Path, log: Path):
        self.proc = proc
        self.state_dir = state_dir
        self.log = log
        self.sock = state_dir / "agent.sock"

    def get(self, target: str, timeout: float = 5.0):
        reply = get(self.sock, target, timeout=timeout)
        assert reply is not None, f"the agent did not answer {target}; log:\n{self.log_text()}"
        return reply

    def json(self, target: str) -> dict:
        return self.get(target).json()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_agent(state_dir: Path, *args: str, backend_args: tuple[str, ...] = ("--backend", "sim"),
                interval: str = "0.25", env: dict | None = None, timeout: float = 30.0,
                agent_args: tuple[str, ...] = ()) -> RunningAgent:
    """Start an agent in the foreground and return once it has sent READY=1 (as it does to systemd).
    args go before the command (global options), agent_args after it."""
    # A unix socket's path has 107 bytes: pytest's (and pytest-xdist's) tmp paths can be longer than that.
    notify_dir = Path(tempfile.mkdtemp(prefix="gwn-"))
    notify_path = notify_dir / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(timeout)
    log = state_dir.parent / f"agent-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir), *backend_args, *args,
           "agent", "--foreground", "--interval", interval, *agent_args]
    full_env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), **(env or {})}
    full_env.pop("GPUWARDEN_BACKEND", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    agent = RunningAgent(proc, state_dir, log)
    try:
        while True:
            try:
                message = notify.recv(4096).decode()
            except TimeoutError:
                proc.kill()
                raise AssertionError(f"no READY=1 from the agent within {timeout}s; log:\n{agent.log_text()}") from None
            if "READY=1" in message.split("\n"):
                agent.ready_message = message
                return agent
    finally:
        notify.close()
        notify_path.unlink(missing_ok=True)
        notify_dir.rmdir()


def snapshot_of(agent: RunningAgent) -> dict:
    return json.loads(agent.get("/v1/snapshot").body)
