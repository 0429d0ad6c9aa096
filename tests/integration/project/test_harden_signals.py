"""SIGTERM and SIGHUP end every long command the way Ctrl-C does: its cleanup runs, it says so in one
line, and the exit status names the signal (128 + N). `engines stop` ends an engine's whole process group.

Real processes and real signals throughout; each test waits for the command to be mid-work (a partial
file, a progress line, a mapped arena), stops it there with SIGSTOP so the signal lands mid-work on a
busy machine too, then sends the signal and lets it run on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.journal import read_journal
from helpers.signals import default_signals

from helpers.paths import REPO
from engines.harness import supervised  # noqa: F401  (fixture)
from helpers.simnode import cli_argv, wait_for

TERM_HUP = [signal.SIGTERM, signal.SIGHUP]


def start(argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals, **kw)


def interrupt(proc: subprocess.Popen, sig: int) -> tuple[str, str]:
    """Freeze it, queue the signal, let it run: the signal arrives mid-work however slow the machine is."""
    os.kill(proc.pid, signal.SIGSTOP)
    os.kill(proc.pid, sig)
    os.kill(proc.pid, signal.SIGCONT)
    return proc.communicate(timeout=60)


def ended_by(proc: subprocess.Popen, err: str, sig: int) -> None:
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert f"gpuwarden: ended by {signal.Signals(sig).name}" in err, err


journal = read_journal


@pytest.mark.parametrize("sig", TERM_HUP, ids=["TERM", "HUP"])
def test_arena_create_leaves_no_partial_file(tmp_path, sig):
    target = tmp_path / "big.arena"
    proc = start([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "arena", "create", str(target), "--size", "2GiB",
                  "--workers", "1"])
    wait_for(lambda: list(tmp_path.glob(".big.arena.partial-*")) or proc.poll() is not None, 30, "the partial file")
    assert proc.poll() is None, "create finished before it could be interrupted"
    _, err = interrupt(proc, sig)
    ended_by(proc, err, sig)
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_arena_verify_stops_at_once(tmp_path):
    from gpuwarden.ops.arena import create
    path = Path("/dev/shm") / f"gw-verify-signal-{os.getpid()}.arena"
    create.create(path, size=1 << 30, workers=2)
    try:
        proc = start([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "arena", "verify", str(path), "--workers", "1"])

        def opened() -> bool:
            try:
                return any(os.readlink(f"/proc/{proc.pid}/fd/{fd}") == str(path)
                           for fd in os.listdir(f"/proc/{proc.pid}/fd"))
            except OSError:
                return False
        wait_for(lambda: opened() or proc.poll() is not None, 30, "verify to open the arena", poll=0.002)
        _, err = interrupt(proc, signal.SIGTERM)
        ended_by(proc, err, signal.SIGTERM)
    finally:
        path.unlink()


def test_purge_journals_where_sigterm_stopped_it(cli, state_dir):
    from helpers.reaper_family import FAMILY, holds_sim_vram
    from helpers.simnode import proc_state

    def parent_ignores_term() -> None:
        default_signals()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the careless parent inherits it: purge must wait on it

    assert cli("sim", "init", "--gpus", "2").returncode == 0
    keeper = subprocess.Popen([sys.executable, "-c", FAMILY, "bad-parent",
                               *cli_argv(state_dir, "sim", "hold", "--gpu", "1", "--size", "1GiB")],
                              stdout=subprocess.PIPE, text=True, preexec_fn=parent_ignores_term)
    parent, tenant = (int(x) for x in keeper.stdout.readline().split())
    try:
        wait_for(lambda: holds_sim_vram(state_dir, tenant), 20, "the tenant to hold VRAM")
        os.kill(tenant, signal.SIGKILL)
        wait_for(lambda: proc_state(tenant) == "Z", 5, "a zombie")
        proc = start(cli_argv(state_dir, "purge", "1", "--yes", "--grace", "60"))
        for line in proc.stdout:
            if "waiting up to 60s" in line:
                break
        _, err = interrupt(proc, signal.SIGTERM)
        ended_by(proc, err, signal.SIGTERM)
        entries = [e for e in journal(state_dir) if e["action"] == "purge"]
        assert entries[-1]["result"] == "interrupted" and entries[-1]["step"] == f"pid-{tenant}", entries[-1]
    finally:
        for pid in (parent, tenant):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        keeper.kill()
        keeper.wait(10)


def test_launch_says_it_was_ended_and_leaves_engines_supervised(tmp_path, supervised):
    from engines.harness import write_config
    cfg = write_config(tmp_path / "node.toml", 3, register_s=1.5)
    proc = start([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(supervised), "--config", str(cfg),
                  "launch", "--stagger", "1"])
    wait_for(lambda: (supervised / "engines" / "e0" / "state.json").exists() or proc.poll() is not None, 30,
             "the first engine's record")
    _, err = interrupt(proc, signal.SIGTERM)
    ended_by(proc, err, signal.SIGTERM)
    assert [e for e in journal(supervised) if e["action"] == "launch"][-1]["result"] == "interrupted"


def test_probe_stops_its_canaries_and_removes_its_arena(tmp_path, state_dir):
    # A simulated KFD limit far above the arena: the canaries' pinned allocations fit and they keep serving.
    proc = start(cli_argv(state_dir, "arena", "probe", "--engines", "2", "--runtime", "sim", "--size", "64MiB",
                          "--copy-buffer", "0", "--hold", "120"),
                 env={**os.environ, "GPUWARDEN_SIM_KFD_LIMIT": "1TiB"})
    for line in proc.stderr:
        if "holding" in line:
            break
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _child_of(int(p), proc.pid)]
    assert pids, "no canary running"
    _, err = interrupt(proc, signal.SIGTERM)
    assert proc.returncode == 143 and "Traceback" not in err, err
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") and _child_of(p, proc.pid) for p in pids), 10,
             "the canaries to be gone")
    assert not list(Path("/dev/shm").glob(f"gpuwarden-probe-{proc.pid}.arena"))


def _child_of(pid: int, parent: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1] == str(parent)
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("args, ready, code", [
    # SIGHUP is no Ctrl-C: the watch exits 129, as the root's exit-status table says (issue 36).
    (("status", "--watch", "--interval", "0.5"), "status:", 129),
    (("sim", "hold", "--gpu", "0", "--size", "1GiB"), "holding", 0),
])
def test_watchers_and_holders_end_cleanly(cli, state_dir, args, ready, code):
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    proc = start(cli_argv(state_dir, *args))
    for line in proc.stdout:
        if ready in line:
            break
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code and "Traceback" not in err, err
    assert not list((state_dir / "sim" / "allocs").glob(f"{proc.pid}-*")), "the holder's VRAM stayed charged"


SH_ENGINE = "sleep 300 & sleep 300 & echo up; wait"


def _group(pgid: int) -> list[int]:
    from gpuwarden.ops.node import procs
    return [p for p in procs.group_members(pgid) if procs.state_of(p) not in ("zombie", "gone")]


@pytest.mark.parametrize("shim_alive", [True, False], ids=["through-shim", "shim-gone"])
def test_engines_stop_ends_a_sh_engines_children(supervised, shim_alive):
    from gpuwarden.ops.engines import control
    from gpuwarden.ops.engines import state as st
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    from gpuwarden.ops.foundation.settings import Settings
    settings = Settings(state_dir=supervised)
    engine = EngineConfig(name="sh0", argv=("sh", "-c", SH_ENGINE), stop_grace=5.0, gated=False)
    shim = control.start(settings, engine, gate_slots=1, registration_timeout=5, workdir=None)
    record = wait_for(lambda: (r := st.read_state(supervised, "sh0")) and r.get("pid") and r, 20, "the engine")
    pid = record["pid"]
    wait_for(lambda: len(_group(pid)) >= 3, 10, "sh and its two sleeps")
    children = [p for p in _group(pid) if p != pid]
    if not shim_alive:
        os.kill(shim, signal.SIGKILL)  # the engine goes on without its supervisor
        wait_for(lambda: not os.path.exists(f"/proc/{shim}") or open(f"/proc/{shim}/stat").read().split()[2] == "Z",
                 10, "the shim gone")
    result = control.stop(settings, "sh0", timeout_s=5)
    assert result.result in ("stopped", "killed"), result
    wait_for(lambda: not _group(pid), 10, "every process of the engine's group gone")
    assert not any(os.path.exists(f"/proc/{c}") and _group(pid) for c in children)


def test_the_console_leaves_on_sigterm(state_dir):
    import pty
    assert subprocess.run(cli_argv(state_dir, "sim", "init", "--gpus", "2"), cwd=REPO,
                          capture_output=True).returncode == 0
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir), "--backend", "sim"],
                            cwd=REPO, stdin=follower, stdout=follower, stderr=follower, preexec_fn=default_signals,
                            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"})
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while b"GPU" not in seen and time.monotonic() < deadline:
            try:
                seen += os.read(leader, 65536)
            except OSError:
                break
        assert b"GPU" in seen, seen[-500:]
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                seen += os.read(leader, 65536)
            except OSError:
                break
        assert proc.wait(timeout=30) == 0
        assert b"\x1b[?1049l" in seen  # it left the alternate screen: the terminal is the operator's again
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)


def test_a_confirmation_answered_with_garbage_then_eof_is_a_no(state_dir):
    import pty
    assert subprocess.run(cli_argv(state_dir, "sim", "init", "--gpus", "2"), cwd=REPO,
                          capture_output=True).returncode == 0
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cli_argv(state_dir, "drain", "1", "--timeout", "1"), cwd=REPO, stdin=follower,
                            stdout=follower, stderr=follower, preexec_fn=default_signals)
    os.close(follower)
    seen = b""
    try:
        while b"[y/N]" not in seen:
            seen += os.read(leader, 4096)
        os.write(leader, b"perhaps\n")
        while b"Answer y or n" not in seen:
            seen += os.read(leader, 4096)
        os.write(leader, b"\x04")  # end of input, as Ctrl-D sends it
        assert proc.wait(timeout=30) == 1, seen
        assert [e for e in journal(state_dir) if e["action"] == "drain"][-1]["result"] == "cancelled"
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)


def test_a_bundle_killed_with_sigkill_takes_its_vendor_tools_with_it(cli, state_dir, tmp_path):
    """Hung vendor tools (each forks a helper, as rocm-smi and amd-smi do) outlived a SIGKILL'd bundle: the last
    one started, killed before the bundle had named its group to the guard (issue 25 item 7)."""
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    bindir, pids = tmp_path / "bin", tmp_path / "pids"
    bindir.mkdir()
    for tool in ("amd-smi", "rocm-smi", "nvidia-smi"):
        (bindir / tool).write_text(f"#!/bin/sh\necho $$ >> {pids}; sleep 120 & echo $! >> {pids}; wait\n")
        (bindir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    bundle = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--state-dir", str(state_dir), "--backend", "sim",
                               "bundle", "--output", str(tmp_path), "--timeout", "60"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # all six tools (three stand-ins, each run for 1-3 collectors in turn... at least three groups) are up
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) >= 6, 30, "the vendor tools to start")
    finally:
        bundle.kill()
        bundle.wait(10)
    tools = [int(p) for p in pids.read_text().split()]
    wait_for(lambda: all(_gone(p) for p in tools), 5, "the tools to die with the bundle")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_the_tool_guard_kills_a_marked_tool_it_was_never_told_of(tmp_path):
    """The window the end-to-end test hit: a tool running (its helper forked) before its group was named."""
    from gpuwarden.ops.bundle.groupguard import GroupGuard
    guard = GroupGuard()
    guard.start()
    pids = tmp_path / "pids"
    tool = subprocess.Popen(["/bin/sh", "-c", f"sleep 120 & echo $! > {pids}; wait"], env=guard.environment(None),
                            start_new_session=True, stdin=subprocess.DEVNULL)
    untouched = subprocess.Popen(["sleep", "120"], start_new_session=True)  # unmarked, never named: left alone
    try:
        helper = int(wait_for(lambda: pids.exists() and pids.read_text().strip(), 10, "the tool's helper"))
        os.close(guard._pipe)  # as the kernel does when the bundle dies
        assert tool.wait(10) == -signal.SIGKILL
        wait_for(lambda: _gone(helper), 10, "the tool's helper to die")
        assert untouched.poll() is None
    finally:
        untouched.kill()
        untouched.wait()
        if tool.poll() is None:
            tool.kill()
