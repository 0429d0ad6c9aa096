"""`gpuwarden launch` with real shims and real engine processes: stagger, crash reports, launcher death."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys

from helpers.paths import REPO
from engines.harness import registration_windows, records, supervised, write_config  # noqa: F401
from helpers.simnode import wait_for

from gpuwarden.ops.node import nodestate


def test_stagger_1_never_overlaps(tmp_path, supervised, cli):
    cfg = write_config(tmp_path / "node.toml", 4, slots=4, register_s=0.25)
    proc = cli("--config", str(cfg), "launch", "--stagger", "1", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[-1]["kind"] == "done" and events[-1]["data"]["ok"]
    # Phases were shown as they moved.
    phases = {(e["data"].get("engine"), e["data"].get("phase")) for e in events if e["kind"] == "info"}
    assert {("e0", "serving"), ("e3", "serving")} <= phases
    windows = registration_windows(supervised)
    assert len(windows) == 4
    for (a, wa), (b, wb) in itertools.combinations(sorted(windows.items()), 2):
        assert wa[1] <= wb[0] or wb[1] <= wa[0], f"{a} {wa} overlaps {b} {wb}"
    assert all(r["phase"] == "serving" for r in records(supervised).values())


def test_overlap_crash_kills_stagger_4_launch(tmp_path, supervised, cli):
    cfg = write_config(tmp_path / "node.toml", 4, register_s=1.5, crash_at=3, marker_dir=tmp_path / "markers",
                       extra=("--startup-s", "0.3"))
    proc = cli("--config", str(cfg), "launch", "--stagger", "4")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "killed by SIGSEGV while registering" in out
    assert "segfault: 3 registrations overlap" in out or "segfault: 4 registrations overlap" in out
    assert "Traceback" not in out
    crashed = [n for n, r in records(supervised).items() if r.get("signal") == "SIGSEGV"]
    assert crashed and all(records(supervised)[n]["phase"] == "crashed" for n in crashed)
    # The shim's automatic incident bundle is named in the failure report and in `engines list`.
    # (one bundle per node every few minutes: a second crashed engine's report says so instead)
    # (two engines crash together: launch may report the one whose note says so while the other's shim is
    # still collecting, so wait for the bundle to land in a record)
    def bundled():
        return [r["bundle"] for n, r in records(supervised).items() if n in crashed and r.get("bundle")]
    bundles = wait_for(bundled, 60, "the crash bundle in a record", poll=0.1)
    assert any(f"incident bundle {b}" in out for b in bundles) or "no new bundle" in out, out
    listing = cli("--config", str(cfg), "engines", "list").stdout
    assert any(f"incident bundle {b}" in listing for b in bundles), listing


def test_overlap_crash_engine_survives_stagger_1(tmp_path, supervised, cli):
    cfg = write_config(tmp_path / "node.toml", 4, register_s=0.3, crash_at=3, marker_dir=tmp_path / "markers")
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(r["phase"] == "serving" and r["signal"] is None for r in records(supervised).values())


def test_shim_holds_the_gate_for_log_only_engines(tmp_path, supervised, cli):
    # These engines neither speak the protocol nor take the gate: the shim must serialise them.
    cfg = write_config(tmp_path / "node.toml", 3, register_s=0.3, crash_at=2, marker_dir=tmp_path / "markers",
                       log_only=True)
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(r["phase"] == "serving" for r in records(supervised).values())


def test_killing_the_launcher_leaves_engines_serving(tmp_path, supervised, cli):
    # The test holds the registration gate, so nothing can serve yet, and kills the launcher once every shim
    # reports: a launcher that started its shims one by one (waiting for each to serve) never got past the
    # first here, and a loaded machine turned that into "3 of 4 serving" when SSH dropped (issue 16).
    from gpuwarden.ops.foundation import gate
    from gpuwarden.ops.engines.control import gate_dir
    from gpuwarden.ops.foundation.settings import Settings
    cfg = write_config(tmp_path / "node.toml", 4, register_s=0.1)
    held = gate.acquire(gate_dir(Settings(state_dir=supervised)), 1, who="test", timeout_s=5)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(supervised), "--config", str(cfg),
         "launch", "--stagger", "1"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        # Every shim forked (the gate keeps all of them from serving): the launch is mid-way.
        def all_forked():
            found = records(supervised)
            return len(found) == 4 and all(r.get("shim_pid") for r in found.values())
        wait_for(all_forked, 20, "all four shims to report")
        assert launcher.poll() is None, "the launch finished before it could be interrupted"
        # What a dropped SSH session does to its process group, then the hard way.
        os.killpg(launcher.pid, signal.SIGHUP)
        os.killpg(launcher.pid, signal.SIGKILL)
    finally:
        launcher.wait(10)
        held.release()

    def all_serving():
        proc = cli("engines", "list", "--json")
        listed = json.loads(proc.stdout)["engines"]
        return len(listed) == 4 and all(e["phase"] == "serving" and not e["stale"] for e in listed)
    wait_for(all_serving, 30, "all four engines serving after the launcher died", poll=0.2)


def test_drained_gpu_is_refused_and_dry_run_starts_nothing(tmp_path, supervised, cli):
    cfg = write_config(tmp_path / "node.toml", 2)
    proc = cli("--config", str(cfg), "launch", "--dry-run")
    assert proc.returncode == 0 and "start e0@GPU0, e1@GPU1" in proc.stdout
    assert records(supervised) == {}
    nodestate.set_drained(supervised, 1, True, who="tester", reason="bad HBM")
    proc = cli("--config", str(cfg), "launch")
    assert proc.returncode == 1
    assert "GPU 1 (engine e1) is drained by tester: bad HBM" in proc.stdout
    assert records(supervised) == {}
    # Leaving the drained GPU's engine out is fine.
    proc = cli("--config", str(cfg), "launch", "e0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(records(supervised)) == {"e0"}


def test_sequential_waits_for_each_engine(tmp_path, supervised, cli):
    cfg = write_config(tmp_path / "node.toml", 3, slots=3, register_s=0.2)
    proc = cli("--config", str(cfg), "launch", "--sequential")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = records(supervised)
    for a, b in (("e0", "e1"), ("e1", "e2")):
        assert recs[a]["phases"]["serving"] <= recs[b]["started_at"]


def test_already_running_engine_is_refused(tmp_path, supervised, cli):
    cfg = write_config(tmp_path / "node.toml", 1)
    assert cli("--config", str(cfg), "launch").returncode == 0
    proc = cli("--config", str(cfg), "launch")
    assert proc.returncode == 1
    assert "engine e0 is already running" in proc.stdout


def test_four_canaries_stagger_1_register_one_at_a_time(tmp_path, supervised, cli):
    arena = tmp_path / "small.arena"
    # Small enough to pin under the 64 KiB RLIMIT_MEMLOCK some containers default to.
    made = cli("arena", "create", str(arena), "--size", "32KiB", "--chunk-size", "8KiB", "-q")
    assert made.returncode == 0, made.stderr
    lines = ["[arena]", f'path = "{arena}"', "", "[stagger]", "slots = 4", ""]
    for i in range(4):
        argv = [sys.executable, "-m", "gpuwarden.ops.canary", "--arena", str(arena), "--gpu", "0", "--runtime", "host"]
        lines += ["[[engines]]", f'name = "c{i}"', f"gpu = {i}", f"argv = {json.dumps(argv)}", ""]
    cfg = tmp_path / "node.toml"
    cfg.write_text("\n".join(lines))
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    windows = registration_windows(supervised)
    assert len(windows) == 4
    for (a, wa), (b, wb) in itertools.combinations(sorted(windows.items()), 2):
        assert wa[1] <= wb[0] or wb[1] <= wa[0], f"{a} {wa} overlaps {b} {wb}"


def test_arena_missing_or_corrupt_stops_the_launch(tmp_path, supervised, cli):
    arena = tmp_path / "a.arena"
    cfg = write_config(tmp_path / "node.toml", 1)
    cfg.write_text(f'[arena]\npath = "{arena}"\n\n' + cfg.read_text())
    proc = cli("--config", str(cfg), "launch")
    assert proc.returncode == 1 and f"arena {arena} does not exist" in proc.stdout
    assert cli("arena", "create", str(arena), "--size", "4MiB", "--chunk-size", "1MiB", "-q").returncode == 0
    with open(arena, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    proc = cli("--config", str(cfg), "launch")
    assert proc.returncode == 1
    assert "FAILED" in proc.stderr and "chunk" in proc.stderr
    assert records(supervised) == {}


def test_preflight_refuses_a_program_that_is_missing_or_not_executable(tmp_path, supervised, cli):
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/sh\nexec sleep 60\n")  # not executable yet
    cfg = tmp_path / "node.toml"
    cfg.write_text('[[engines]]\nname = "a"\ngpu = 0\nargv = ["./serve.sh"]\n\n'
                   '[[engines]]\nname = "b"\ngpu = 1\nargv = ["no-such-engine-binary", "--port", "1"]\n\n'
                   '[[engines]]\nname = "c"\ngpu = 2\nargv = ["/opt/nowhere/serve"]\n')
    proc = cli("--config", str(cfg), "launch", "--dry-run")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "engine a: program ./serve.sh is not executable" in out
    assert "engine b: program 'no-such-engine-binary' is not on the PATH it runs with" in out
    assert "engine c: program /opt/nowhere/serve does not exist" in out
    assert records(supervised) == {}
    script.chmod(0o755)
    proc = cli("--config", str(cfg), "launch", "a", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
