"""The state dir turned read-only under a running agent (issue 25 item 6's last fault), staged for real.

Measured on Linux 6.18: `mount -o remount,ro` of a tmpfs with a file open for writing, and `remount,bind,ro`
of that mount or of a bind mount with a writer on it, fail with EBUSY (the kernel counts each mount's
writers and will not make it read-only under them); a bind mount made read-only while nobody writes through
it succeeds, but only new opens through it fail: the agent's open event and trend files stay on the
writable mount beneath and go on writing, so that stages nothing. What does
turn a file system read-only under open writers is the kernel itself, on an error: an ext4 mounted with
errors=remount-ro, made to record one through its sysfs trigger_fs_error file, goes read-only at once and
every write after it, through fds already open too, fails with EROFS. That is the fault a node meets when
its disk errors. Linux 6.x then keeps that superblock read-only ("emergency_ro": `mount -o remount,rw`
returns 0 and changes nothing) until it is unmounted, which the agent's open files and socket prevent: the
fault has no recovery while the same agent runs, so recovery is the agent's restart on a remounted state dir.

Needs root, a loop device, mkfs.ext4 (e2fsprogs, installed by tests/run-all.sh) and the kernel's trigger."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.agentnode import start_agent
from helpers.cli import gpuwarden
from helpers.simnode import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/loop-control")
                                or shutil.which("mkfs.ext4") is None,
                                reason="needs root, loop devices and mkfs.ext4 (CI runs as root)")


class ErrorProneFs:
    """A 16 MiB ext4 image, loop-mounted with errors=remount-ro; fail() makes the kernel record an error."""

    def __init__(self, where: Path):
        self.where = where
        self.image = where.parent / f"{where.name}.img"
        self.mounted = False

    def mount(self) -> None:
        if not self.image.exists():
            with open(self.image, "wb") as f:
                f.truncate(16 << 20)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        self.where.mkdir(exist_ok=True)
        subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.where)], check=True)
        self.mounted = True
        os.chmod(self.where, 0o700)  # it is the state dir itself (the agent's log goes beside it, off this fs)

    def device(self) -> str:
        source = subprocess.run(["findmnt", "-no", "SOURCE", str(self.where)], capture_output=True, text=True,
                                check=True).stdout.strip()
        return os.path.basename(source)

    def trigger(self) -> Path:
        return Path("/sys/fs/ext4") / self.device() / "trigger_fs_error"

    def fail(self) -> None:
        self.trigger().write_text("gpuwarden test: the state dir's disk errors\n")

    def options(self) -> str:
        return subprocess.run(["findmnt", "-no", "OPTIONS", str(self.where)], capture_output=True, text=True,
                              check=True).stdout.strip()

    def umount(self) -> None:
        if self.mounted:
            if subprocess.run(["umount", str(self.where)], check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(self.where)], check=False)  # a failed test left a file open
            self.mounted = False


@pytest.fixture
def erroring_fs(tmp_path: Path):
    fs = ErrorProneFs(tmp_path / "fs")
    fs.mount()
    try:
        if not fs.trigger().exists():
            pytest.skip(f"this kernel has no {fs.trigger()}")
        yield fs
    finally:
        fs.umount()


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_a_state_dir_gone_read_only_under_the_agent(erroring_fs):
    state = erroring_fs.where
    assert gpuwarden("--state-dir", str(state), "sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    agent = start_agent(state)
    events = state / "agent" / "events.jsonl"
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="a healthy agent")
        os.sync()  # what reached the disk before it errored (an aborted ext4 journal drops dirty pages)
        written = events.read_bytes()
        erroring_fs.fail()
        assert "emergency_ro" in erroring_fs.options() or erroring_fs.options().startswith("ro")
        with pytest.raises(OSError) as probe:  # the kernel's answer to any write now
            (state / "probe").write_bytes(b"x")
        assert probe.value.errno == 30  # EROFS

        def reloads() -> int:
            return len([e for e in agent.json("/v1/events")["events"] if "reloaded" in e["text"]])
        for _ in range(3):  # each reload is an event to write; one at a time (signals together are one reload)
            n = reloads()
            agent.proc.send_signal(signal.SIGHUP)
            wait_for(lambda n=n: reloads() > n, what="the reload's event, in memory")
        assert "event log" in agent.json("/healthz")["writes_failing"]
        assert len(lines_with(agent.log_text(), "event log: writing")) == 1, agent.log_text()
        assert "Read-only file system" in agent.log_text()
        before = agent.json("/v1/snapshot")["taken_at"]
        wait_for(lambda: agent.json("/v1/snapshot")["taken_at"] > before, what="sampling going on")
        assert agent.json("/healthz")["ok"] is True
        assert events.read_bytes() == written  # nothing half-written, nothing already written lost

        # The operator's commands: status answers from the agent; a command that journals says so in one line.
        status = gpuwarden("--state-dir", str(state), "--backend", "sim", "status", "--json", timeout=60)
        assert status.returncode in (0, 1) and json.loads(status.stdout)["gpus"], status.stderr
        journaled = gpuwarden("--state-dir", str(state), "--backend", "sim", "drain", "1",
                              timeout=60)
        assert "Traceback" not in journaled.stderr, journaled.stderr
        assert len(lines_with(journaled.stderr, "Read-only file system")) == 1, journaled.stderr

        # No remount brings it back while the agent runs: measured, not assumed.
        subprocess.run(["mount", "-o", "remount,rw", str(erroring_fs.where)], check=False, capture_output=True)
        with pytest.raises(OSError):
            (state / "probe").write_bytes(b"x")
        assert subprocess.run(["umount", str(erroring_fs.where)], capture_output=True).returncode != 0  # busy
    finally:
        stopped = agent.stop()
    assert stopped == 0, agent.log_text()
    lost_nothing = events.read_bytes()
    assert lost_nothing == written and all(json.loads(line) for line in lost_nothing.splitlines())

    # Recovery: the file system remounted (after fsck, on a real node), the agent started again writes again.
    erroring_fs.umount()
    subprocess.run(["e2fsck", "-fy", str(erroring_fs.image)], capture_output=True, check=False)
    erroring_fs.mount()
    agent = start_agent(state)
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="a healthy agent again")
        n = len(events.read_bytes())
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: len(events.read_bytes()) > n, what="events written again")
        assert agent.json("/healthz")["writes_failing"] == {}
        assert events.read_bytes().startswith(written)
    finally:
        assert agent.stop() == 0


def test_history_on_a_state_dir_gone_read_only_says_so_once(erroring_fs):
    from gpuwarden.ops.agent.history import History
    from gpuwarden.ops.agent.writewatch import WriteWatch
    said: list[str] = []
    history = History(erroring_fs.where / "agent", 1.0, watch=WriteWatch(lambda level, text: said.append(text)))
    try:
        check_history(history, erroring_fs, said)
    finally:
        history.close()


def check_history(history, erroring_fs: ErrorProneFs, said: list[str]) -> None:
    from helpers.agent_faults import snapshot
    t0 = 1_800_000_000.0
    history.add(snapshot(t0, 1))
    history.add(snapshot(t0 + 60, 2))
    trend = erroring_fs.where / "agent" / "trend.jsonl"
    kept = trend.read_bytes()
    assert kept.count(b"\n") == 1
    erroring_fs.fail()
    for k in range(2, 6):  # each closes a minute: a trend line to write
        history.add(snapshot(t0 + 60 * k, k))
    assert len(said) == 1 and said[0].startswith("history: writing") and "Read-only file system" in said[0], said
    assert trend.read_bytes() == kept
    assert history.series(0, resolution="minute")["minute"]["points"] == 6  # the disk missed four, memory none
