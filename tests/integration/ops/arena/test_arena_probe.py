"""`arena probe`: N real canaries behind a K-slot gate, per-canary register time, GB/s and how each ended.

sim and host runtimes here; the cuda run on an H200 node is tests/device/arena_probe.sh.
"""

from __future__ import annotations

import json

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.probe import Probe, ProbeOptions, table


def test_probe_cli_three_sim_canaries_one_at_a_time(cli, tmp_path):
    proc = cli("arena", "probe", "--engines", "3", "--concurrency", "1", "--runtime", "sim", "--size", "4MiB",
               "--json", timeout=120, env={"GPUWARDEN_SIM_KFD_LIMIT": "1GiB"})  # room for all: no incident
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["arena_bytes"] == 4 << 20
    rows = report["canaries"]
    assert [r["gpu"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["ended"] == "exit 0" and r["register_seconds"] is not None and r["gbps"] > 0
    # The temporary arena is gone afterwards.
    from pathlib import Path
    assert not Path(report["arena"]).exists()


def test_probe_reports_a_crash_by_signal_name(tmp_path, state_dir):
    from gpuwarden.ops.arena.create import create
    arena = tmp_path / "a.arena"
    create(arena, size=2 << 20, chunk_size=1 << 20)
    lines: list[str] = []
    opts = ProbeOptions(engines=2, concurrency=2, runtime="host", arena=str(arena), workdir=str(tmp_path),
                        extra=("--crash-at", "registered", "--crash-signal", "SEGV"))
    report = Probe(Settings(state_dir=state_dir), opts, lines.append).run()
    assert not report["ok"]
    assert [c["ended"] for c in report["canaries"]] == ["SIGSEGV", "SIGSEGV"]
    assert all(c["register_seconds"] is not None for c in report["canaries"])
    assert arena.exists(), "a probe must not delete an arena it was given"
    text = "\n".join(table(report))
    assert "SIGSEGV" in text and "PROBLEMS" in text
    assert any("ended (SIGSEGV) in phase registered" in line for line in lines)
    journal = (state_dir / "journal.log").read_text()
    assert '"action": "arena probe"' in journal and '"result": "failed"' in journal


def test_probe_table_on_a_terminal_free_run(cli, tmp_path):
    proc = cli("arena", "probe", "--engines", "2", "--concurrency", "2", "--runtime", "host", "--size", "2MiB")
    assert proc.returncode == 0, proc.stderr
    assert "register s" in proc.stdout and "all canaries registered, served and stopped cleanly" in proc.stdout
    assert "started 2 canaries" in proc.stderr


def test_probe_reproduces_a_budget_failure_on_the_sim_node(tmp_path, state_dir, monkeypatch):
    """With a simulated KFD limit of 10 MiB, three 4 MiB registrations fit two: the third canary fails."""
    from gpuwarden.ops.arena.create import create
    arena = tmp_path / "a.arena"
    create(arena, size=4 << 20, chunk_size=1 << 20)
    monkeypatch.setenv("GPUWARDEN_SIM_KFD_LIMIT", "10MiB")
    report = Probe(Settings(state_dir=state_dir), ProbeOptions(engines=3, concurrency=1, runtime="sim",
                                                               arena=str(arena), workdir=str(tmp_path))).run()
    assert not report["ok"]
    ended = sorted(c["ended"] for c in report["canaries"])
    assert ended == ["exit 0", "exit 0", "exit 2"]
    failed = next(c for c in report["canaries"] if c["ended"] == "exit 2")
    assert "hipErrorInvalidValue" in failed["error"] and "limit 10.0 MiB" in failed["error"]
    assert failed["register_seconds"] is None


def test_probe_trace_keeps_capped_redacted_logs_and_says_what_it_would_capture(tmp_path, state_dir):
    import os
    import stat

    from gpuwarden.ops.foundation import jsondoc
    from gpuwarden.ops.foundation.jsondoc import document
    from gpuwarden.playbooks import probetrace
    settings = Settings(state_dir=state_dir, config_path=state_dir / "node.toml", backend="sim")  # the node: simulated
    opts = ProbeOptions(engines=1, concurrency=1, runtime="hip", size=4 << 20, copy_buffer="0", trace=True,
                        workdir=str(tmp_path), timeout_s=60)
    report = Probe(settings, opts).run()  # no ROCm here: the hip canary fails, the trace says what it would do
    jsondoc.validate(document("arena-probe", report))
    t = report["trace"]
    assert not report["ok"] and t["runtime_traced"] is False
    assert "AMD_LOG_LEVEL=3" in t["note"] and "HSAKMT_DEBUG_LEVEL=5" in t["note"] and "rocprofv3" in t["note"]
    assert t["env"]["AMD_LOG_MASK"] == "0xc01" and t["rocprofv3_missing"] == (probetrace.shutil.which("rocprofv3") is None)
    (f,) = t["files"]
    assert stat.S_IMODE(os.stat(f["path"]).st_mode) == 0o600 and "libamdhip64" in open(f["path"]).read()
    # the trace's own pieces: the env reaches the canary, rocprofv3 (when present) wraps its argv
    tr = probetrace.Trace("hip", tmp_path)
    tr.rocprof = "/opt/rocm/bin/rocprofv3"
    assert tr.wrap(["python", "-m", "x"], 2)[:4] == ["/opt/rocm/bin/rocprofv3", "--hip-trace", "--hsa-trace",
                                                     "--memory-copy-trace"]
    assert probetrace.Trace("sim", tmp_path).env() == {}


def test_trace_caps_and_redacts_a_log(tmp_path):
    from gpuwarden.playbooks import probetrace
    log = tmp_path / "canary-0.log"
    token = "hf_" + "Sekrit9" * 5
    log.write_text(f"loading with HF_TOKEN={token}\n" + "x" * 200 + "\n:1:hip_memory.cpp: hipHostRegister "
                   "failed: hipErrorOutOfMemory\n")
    old = probetrace.LOG_CAP
    probetrace.LOG_CAP = 128
    try:
        out = probetrace.Trace("sim", tmp_path).collect([log])
    finally:
        probetrace.LOG_CAP = old
    (f,) = out["files"]
    kept = open(f["path"]).read()
    assert f["truncated"] and token not in kept and "cut by gpuwarden" in kept
    # a failed registration is KFD's system-memory limit, not GPU memory (issue 33)
    assert any("host memory KFD charges" in x for x in out["findings"]), out["findings"]


def test_the_readme_probe_replays_the_incident_on_the_sim_by_default(cli, monkeypatch):
    """`arena probe --engines 4 --concurrency 4 --runtime sim` as the README gives it: every registration
    succeeds, the ledger nears the limit, each canary's next pinned allocation fails and it dies of SIGSEGV."""
    monkeypatch.delenv("GPUWARDEN_SIM_KFD_LIMIT", raising=False)
    proc = cli("arena", "probe", "--engines", "4", "--concurrency", "4", "--runtime", "sim", "--json", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["arena_bytes"] == 64 << 20
    rows = report["canaries"]
    assert all(c["register_seconds"] is not None for c in rows), rows  # every registration succeeded
    assert [c["ended"] for c in rows] == ["SIGSEGV"] * 4, rows
    from pathlib import Path
    logs = [Path(c["log"]).read_text() for c in rows]
    assert all("session is up" in t and "hipHostMalloc of 16.0 MiB returned hipErrorOutOfMemory" in t
               and "libamdhip64.so.7" in t for t in logs), logs[0]


def test_the_sim_probe_reports_the_failed_call_cleanly_and_visibility_all_charges_the_same(cli, monkeypatch):
    monkeypatch.delenv("GPUWARDEN_SIM_KFD_LIMIT", raising=False)
    for visibility in ("own", "all"):
        proc = cli("arena", "probe", "--engines", "2", "--runtime", "sim", "--size", "8MiB", "--visibility",
                   visibility, "--on-pin-failure", "report", "--json", timeout=120)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        rows = json.loads(proc.stdout)["canaries"]
        assert [c["ended"] for c in rows] == ["exit 2", "exit 2"], (visibility, rows)
        assert all(c["register_seconds"] is not None for c in rows), (visibility, rows)
        # 2 x 8 MiB + 1 MiB: the same limit and the same charge whatever the canaries see.
        assert all("ledger holds 16.0 MiB of its 17.0 MiB" in c["error"] for c in rows), (visibility, rows)


def test_a_probe_on_gpus_the_node_lacks_is_refused(cli):
    assert cli("sim", "init", "--gpus", "4").returncode == 0
    proc = cli("arena", "probe", "--engines", "6", "--runtime", "sim", "--size", "1MiB", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no GPU 4 on this node (GPUs: 0, 1, 2, 3)" in proc.stderr and "for the GPU indexes" in proc.stderr
    assert "canary" not in proc.stdout


def test_the_sim_probe_after_the_scenario_names_what_is_already_charged(tmp_path, state_dir, monkeypatch):
    from gpuwarden.ops.node.sim import registrations
    monkeypatch.delenv("GPUWARDEN_SIM_KFD_LIMIT", raising=False)
    # Another live process's charge in the simulated ledger: this test's own pid, 5 MiB.
    registrations.add(state_dir, gpu=0, size=5 << 20, address=0x1000, path=None)
    lines: list[str] = []
    report = Probe(Settings(state_dir=state_dir), ProbeOptions(
        engines=2, concurrency=2, runtime="sim", size=8 << 20, workdir=str(tmp_path), pin_failure="report"),
        lines.append).run()
    assert report["already_charged"][0]["bytes"] == 5 << 20
    assert any("already holds 5.0 MiB" in line and "only this probe's canaries" in line for line in lines), lines
    # Both registrations fit despite the 5 MiB: the probe measured its own canaries.
    assert all(c["register_seconds"] is not None for c in report["canaries"]), report


def test_a_probe_whose_runtime_library_is_missing_is_one_line_exit_2(cli):
    import importlib.util
    import pytest
    if importlib.util.find_spec("cuda") is not None:
        pytest.skip("cuda-bindings is installed here")
    proc = cli("arena", "probe", "--engines", "2", "--size", "1MiB", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "gpuwarden: error: cuda: the cuda runtime needs cuda-bindings, which is not installed", lines
    assert len(lines) == 2 and lines[1].startswith("  hint: ") and "canary" not in proc.stderr


def test_probe_trace_turns_kfds_limit_message_on_for_the_probe_and_restores_it(tmp_path, state_dir):
    import os
    from gpuwarden.ops.node.debugfs.dyndbg import FUNCTION, KfdLimitDebug
    sys_root = tmp_path / "sys"
    control = sys_root / "kernel" / "debug" / "dynamic_debug" / "control"
    control.parent.mkdir(parents=True)
    control.write_text("# filename:lineno [module]function flags format\n"
                       f"drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd_gpuvm.c:230 [amdgpu]{FUNCTION} =_ "
                       '"Set no_system_mem_limit=1 if using shared memory\\012"\n')
    lines: list[str] = []
    settings = Settings(state_dir=state_dir, sysfs_root=sys_root)
    report = Probe(settings, ProbeOptions(engines=1, concurrency=1, runtime="sim", size=1 << 20, trace=True,
                                          workdir=str(tmp_path)), lines.append).run()
    queries = [ln for ln in control.read_text().splitlines() if ln.startswith("func ")]
    assert queries == [f"func {FUNCTION} +p", f"func {FUNCTION} -p"], control.read_text()
    notes = report["trace"]["kfd_debug"]
    assert "turned on" in notes[0] and "journaled" in notes[0] and "off again" in notes[1]
    journal = (state_dir / "journal.log").read_text()
    assert journal.count('"action": "dynamic-debug"') == 2
    # Not root: nothing written, and it says why.
    assert "needs root" in KfdLimitDebug(sys_root, state_dir, euid=1000).enable()
    # Already on: left as it is, and not turned off after.
    control.write_text(control.read_text().replace(" =_ ", " =p "))
    already = KfdLimitDebug(sys_root, state_dir)
    assert "already on" in already.enable() and already.restore() is None
    assert os.path.exists(control)
