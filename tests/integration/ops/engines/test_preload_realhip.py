"""Unmodified engines under the interposer against ROCm 5.4's real HIP runtime (tests/helpers/realhip.py fetches it).

This machine has no GPU (no /dev/kfd): the real hipHostRegister fails its runtime initialisation and returns an
error at once. That error path is exactly the one that broke (issue 25): what the interposer records, and what
launch, engines list and status say, are checked against the real library, called through the program's own
symbols, through dlopen + dlsym, and through ctypes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engines.harness import records, supervised  # noqa: F401
from engines.preload_harness import Engine, events, preload_env
from gpuwarden.ops.engines import runtime_errors
from standins.preload_build import CTYPES_ENGINE, SOURCES
from helpers.paths import TESTS

SIZE = 300 << 20  # above the default 256 MiB threshold
ENGINES = TESTS / "engines"


@pytest.fixture(scope="module")
def real_engines(real_hip: Path, tmp_path_factory) -> Path:
    """The unmodified engines, compiled here against the real library (run path: the cache)."""
    out = tmp_path_factory.mktemp("realhip-engines")
    cc = os.environ.get("CC") or "cc"
    rpath = f"-Wl,-rpath,{real_hip}"
    for target, args in (
        ("engine_linked", [str(SOURCES / "engine.c"), "-DLINKED", rpath, f"-L{real_hip}", "-l:libamdhip64.so", "-ldl"]),
        ("engine_dlopen", [str(SOURCES / "engine.c"), rpath, "-ldl"]),
        ("unchecked_engine", [str(ENGINES / "unchecked_engine.c"), rpath, f"-L{real_hip}", "-l:libamdhip64.so"]),
    ):
        done = subprocess.run([cc, "-O1", "-Wall", "-o", str(out / target), *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return out


def argv(engines: Path, real_hip: Path, mode: str, size: int = SIZE) -> list[str]:
    if mode == "ctypes":
        return [sys.executable, str(CTYPES_ENGINE), str(size), str(real_hip), "hip"]
    return [str(engines / ("engine_linked" if mode == "linked" else "engine_dlopen")), str(size), mode]


def test_the_library_is_the_real_one(real_hip):
    dyn = subprocess.run(["readelf", "--dyn-syms", "-W", str(real_hip / "libamdhip64.so")], capture_output=True,
                         text=True)
    if dyn.returncode != 0:
        pytest.skip("readelf (binutils) is not installed")
    assert "hipHostRegister@@hip_4.2" in dyn.stdout


def test_the_error_names_are_the_runtimes_own(real_hip):
    # Our table of names (what launch and status print) against the real hipGetErrorName, code by code.
    script = ("import ctypes, json, sys\n"
              "lib = ctypes.CDLL(sys.argv[1])\n"
              "lib.hipGetErrorName.restype = ctypes.c_char_p\n"
              "print(json.dumps({c: lib.hipGetErrorName(int(c)).decode() for c in sys.argv[2:]}))\n")
    codes = [str(c) for c in runtime_errors.HIP]
    done = subprocess.run([sys.executable, "-c", script, str(real_hip / "libamdhip64.so"), *codes],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    theirs = {int(k): v for k, v in json.loads(done.stdout).items()}
    assert theirs == runtime_errors.HIP


def test_without_the_interposer_the_real_call_fails_at_once(real_engines, real_hip, tmp_path):
    # The baseline: what the real runtime itself returns here, with nothing of ours loaded.
    engine = Engine(argv(real_engines, real_hip, "linked"), {}, tmp_path)
    try:
        engine.wait_output("serving")
        assert "register returned 101" in engine.output  # hipErrorInvalidDevice: hsa_init fails without /dev/kfd
    finally:
        engine.stop()


@pytest.mark.parametrize("mode,via", [("linked", "symbol"), ("dlopen", "dlsym"), ("ctypes", "dlsym")])
def test_the_interposer_records_the_real_error(mode, via, real_engines, real_hip, tmp_path):
    engine = Engine(argv(real_engines, real_hip, mode), preload_env(tmp_path), tmp_path)
    try:
        engine.wait_output("serving")
    finally:
        assert engine.stop() == 0, engine.output
    assert "register returned 101" in engine.output  # the interposer hands the engine the real result
    got = [e for e in events(tmp_path) if e.phase in ("registering", "register-failed", "registered")]
    assert [e.phase for e in got] == ["registering", "register-failed"], got
    failed = got[1].data
    assert failed["call"] == "hipHostRegister" and failed["bytes"] == SIZE and failed["result"] == 101
    assert failed["via"] == via
    assert failed["seconds"] < 0.05, failed  # measured 0.1-0.3 ms: the runtime gives up before any pinning
    # Gated: it took the slot, and gave it back (the next acquire does not wait).
    from gpuwarden.ops.foundation import gate
    gate.acquire(tmp_path / "gate", 1, timeout_s=2).release()


def _config(path: Path, engines: Path, real_hip: Path, *, ready: bool) -> Path:
    lines = ["[stagger]", "slots = 4", "registration_timeout = 30", "",
             "[defaults]", 'progress = "preload"', "stop_grace = 3"]
    if ready:
        lines.append('ready_pattern = "^serving"')
    lines.append("")
    for i, mode in enumerate(("linked", "dlopen", "ctypes")):
        lines += ["[[engines]]", f'name = "{mode}"', f"gpu = {i}",
                  f"argv = {json.dumps(argv(engines, real_hip, mode))}", ""]
    path.write_text("\n".join(lines))
    return path


@pytest.mark.parametrize("ready", [False, True], ids=["no-ready-pattern", "ready-pattern"])
def test_launch_against_the_real_runtime_fails_at_once_and_says_why(ready, real_engines, real_hip, supervised, cli,
                                                                     tmp_path):
    assert cli("sim", "init", "--gpus", "3", "--vram", "8GiB").returncode == 0
    cfg = _config(tmp_path / "node.toml", real_engines, real_hip, ready=ready)
    t0 = time.monotonic()
    proc = cli("--config", str(cfg), "launch", "--stagger", "1")
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert took < 20, f"launch took {took:.1f}s (its timeout: 150 s)"
    assert "hipHostRegister of 300.0 MiB returned hipErrorInvalidDevice (101)" in out, out
    assert "serving after" not in out and "Traceback" not in out
    recs = records(supervised)
    failed = {n for n, r in recs.items() if r.get("phase") == "failed-registration"}
    assert failed, recs
    for name in failed:
        (reg,) = [r for r in recs[name]["registrations"] if r["kind"] == "register"]
        assert reg["outcome"] == "failed" and reg["result"] == 101 and reg["bytes"] == SIZE
    listing = cli("engines", "list").stdout
    assert "failed-registration" in listing and "300.0 MiB FAILED" in listing, listing
    status = cli("--backend", "sim", "status")
    assert status.returncode == 1 and "status: NEEDS ATTENTION" in status.stdout, status.stdout
    assert "returned hipErrorInvalidDevice (101)" in status.stdout
    assert json.loads(cli("--backend", "sim", "status", "--json").stdout)["needs_attention"] is True
    assert '"action": "engine-register-failed"' in (supervised / "journal.log").read_text()


def test_a_crash_after_a_failed_registration_leads_its_bundles_triage(real_engines, real_hip, supervised, cli,
                                                                       tmp_path):
    # The arena incident's sequence on the real runtime: the registration fails, the engine ignores it and faults
    # 0.4 s later writing through the pointer it never got. The shim's automatic bundle is taken for that crash:
    # its triage, the CLI's and the TUI's engine view, must lead with the failed call, then the crash.
    import re
    from helpers.simnode import wait_for
    assert cli("sim", "init", "--gpus", "1", "--vram", "8GiB").returncode == 0
    cfg = tmp_path / "node.toml"
    cfg.write_text('[[engines]]\nname = "dp3"\ngpu = 0\nprogress = "preload"\n'
                   f'argv = {json.dumps([str(real_engines / "unchecked_engine"), str(SIZE), "400"])}\n')
    proc = cli("--config", str(cfg), "launch")
    assert proc.returncode == 1 and "returned hipErrorInvalidDevice (101)" in proc.stdout + proc.stderr
    wait_for(lambda: records(supervised)["dp3"].get("bundle") or records(supervised)["dp3"].get("bundle_note"), 60,
             "the automatic bundle of dp3's crash")
    record = records(supervised)["dp3"]
    assert record["phase"] == "crashed" and record["signal"] == "SIGSEGV", record
    assert record["detail"] == "killed by SIGSEGV after its registration failed", record["detail"]
    bundle = record["bundle"]
    assert bundle, record
    doc = json.loads(cli("triage", bundle, "--json").stdout)
    headline = doc["headline"]
    want = re.compile(r"^dp3: hipHostRegister of 300\.0 MiB returned hipErrorInvalidDevice at \d\d:\d\d:\d\d\.\d; "
                      r"SIGSEGV( in unchecked_engine at 0x[0-9a-f]+)? 0\.[4-7] s later: "
                      r"the engine used a buffer it failed to register$")
    assert want.match(headline), headline
    assert doc["subject"]["engine"] == "dp3" and doc["findings"][0]["scope"] == "subject"
    # Other processes' faults in the host's kernel log (this machine runs other tests' crashing stand-ins) stay
    # listed, as theirs, after everything about dp3.
    scopes = [f.get("scope") for f in doc["findings"]]
    others = [f for f in doc["findings"] if f.get("scope") == "other-process"]
    assert scopes[-len(others):] == ["other-process"] * len(others) if others else True
    assert all(f["title"].startswith(("another process on this host", "other processes on this host"))
               for f in others)
    from gpuwarden.tui.screens.engine_log import triage_headline
    assert triage_headline(Path(bundle), "dp3") == headline
