"""`arena probe`: N real canaries behind a K-slot gate, per-canary register time, GB/s and how each ended.

sim and host runtimes here; the cuda run on an H200 node is tests/device/arena_probe.sh.
"""

from __future__ import annotations

import json

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.probe import Probe, ProbeOptions, table


def test_probe_cli_three_sim_canaries_one_at_a_time(cli, tmp_path):
    proc = cli("arena", "probe", "--engines", "3", "--concurrency", "1", "--runtime", "sim", "--size", "4MiB",
               "--json", timeout=120)
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
    assert "simulated KFD system limit 10.0 MiB" in failed["error"] and failed["register_seconds"] is None


def test_probe_trace_keeps_capped_redacted_logs_and_says_what_it_would_capture(tmp_path, state_dir):
    import os
    import stat

    from gpuwarden.ops.foundation import jsondoc
    from gpuwarden.ops.foundation.jsondoc import document
    from gpuwarden.playbooks import probetrace
    settings = Settings(state_dir=state_dir, config_path=state_dir / "node.toml")
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
    assert any("out of GPU memory" in x for x in out["findings"])


def test_the_readme_probe_reproduces_the_incident_on_the_sim_by_default(cli, monkeypatch):
    """`arena probe --engines 4 --concurrency 4 --runtime sim` as the README gives it: no --size, no
    GPUWARDEN_SIM_KFD_LIMIT; the simulated node's limit holds three registrations, the fourth fails."""
    monkeypatch.delenv("GPUWARDEN_SIM_KFD_LIMIT", raising=False)
    proc = cli("arena", "probe", "--engines", "4", "--concurrency", "4", "--runtime", "sim", "--json", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["arena_bytes"] == 64 << 20
    ended = sorted(c["ended"] for c in report["canaries"])
    assert ended == ["exit 0", "exit 0", "exit 0", "exit 2"], report
    failed = next(c for c in report["canaries"] if c["ended"] == "exit 2")
    assert "simulated KFD system limit 192.0 MiB" in failed["error"]
    # Three fit, whatever the concurrency: the limit is checked and charged under one lock.
    again = cli("arena", "probe", "--engines", "3", "--concurrency", "3", "--runtime", "sim", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr


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
