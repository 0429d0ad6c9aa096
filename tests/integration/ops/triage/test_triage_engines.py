"""Engine-side triage: what a crashed engine died of, from a real bundle of real crashes, and from engine logs.

The storm test is the arena incident in miniature: four supervised engines register, then fault together
in one shared library at one offset; the kernel logs the segfaults, the cores are real, the bundle is made
by the real CLI and `triage` must say first: 4 engines died of SIGSEGV in that library at that offset.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from engines.harness import records, supervised  # noqa: F401
from helpers.simnode import wait_for

from helpers.paths import TESTS

HERE = TESTS / "engines"


def _build(tmp: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the crashing stand-in engine")
    lib = tmp / "libgwcrash.so.7"
    exe = tmp / "crash_engine"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(HERE / "crash_lib.c")], check=True)
    subprocess.run([cc, "-O1", "-o", str(exe), str(HERE / "crash_engine.c"), str(lib), f"-Wl,-rpath,{tmp}"],
                   check=True)
    return exe


def _config(tmp: Path, exe: Path, arena: Path, go: Path) -> Path:
    lines = ["[arena]", f'path = "{arena}"', 'size = "1MiB"', "", "[stagger]", "slots = 4", "",
             "[defaults]", 'progress = "log"', 'registered_pattern = "session is up"', 'restart = "no"', ""]
    for i in range(4):
        work = tmp / f"work{i}"
        work.mkdir()
        lines += ["[[engines]]", f'name = "dp{i}"', f"gpu = {i}", f'workdir = "{work}"',
                  f"argv = {json.dumps([str(exe), str(go), '--arena', str(arena)])}", ""]
    cfg = tmp / "node.toml"
    cfg.write_text("\n".join(lines))
    return cfg


@pytest.mark.slow
def test_four_engines_dying_together_are_one_headline(tmp_path, supervised, cli):
    exe = _build(tmp_path)
    arena, go = tmp_path / "experts.arena", tmp_path / "go"
    assert cli("arena", "create", str(arena), "--size", "1MiB").returncode == 0
    cfg = _config(tmp_path, exe, arena, go)
    proc = cli("--config", str(cfg), "launch", "--stagger", "4", "--json", timeout=120)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    wait_for(lambda: len(records(supervised)) == 4 and all(
        "registered" in (r.get("phases") or {}) for r in records(supervised).values()), timeout=60,
        what="four engines registered")
    go.touch()
    wait_for(lambda: all(r.get("phase") == "crashed" for r in records(supervised).values()), timeout=60,
             what="four engines crashed")
    out = tmp_path / "bundle.tar.gz"
    proc = cli("--config", str(cfg), "bundle", "--safe-mode", "--output", str(out), "--timeout", "20", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    t0 = time.monotonic()
    proc = cli("triage", str(out), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    from gpuwarden.ops.foundation import jsondoc
    jsondoc.validate(doc)
    # what the issue asks of the storm's first line, with this stand-in's library and offset
    headline = doc["headline"]
    assert headline.startswith("4 engines died of SIGSEGV in libgwcrash.so.7 at offset 0x"), headline
    assert "within 1 s, after registering a shared arena" in headline, headline
    engines = {e["name"]: e for e in doc["engines"]}
    assert sorted(engines) == ["dp0", "dp1", "dp2", "dp3"]
    offsets = {e.get("offset") for e in engines.values()}
    # The kernel prints 'segfault at' through printk_ratelimit(): with the suite's other crashes in the same seconds
    # a line can be dropped; that engine is still one of the storm, and the headline says why it names no place.
    unplaced = sorted(n for n, e in engines.items() if e.get("offset") is None)
    assert len(offsets - {None}) == 1 and len(unplaced) <= 1, engines
    if unplaced:
        assert "(1 of them without a fault line of its own" in headline, headline
    if any(e.get("backtrace") for e in engines.values()):
        # the core's stack names the function and agrees with the kernel's offset
        e = next(e for e in engines.values() if e.get("backtrace"))
        assert e["function"] == "gw_register_arena" and "libgwcrash.so.7" in e["backtrace"][0]
    text = cli("triage", str(out)).stdout
    assert text.splitlines()[0] == headline
    assert time.monotonic() - t0 < 30  # two CLI runs; the bench measures the triage itself


@pytest.mark.slow
def test_the_arena_scenarios_bundle_leads_with_the_crashed_canary(standins, supervised, cli, tmp_path):
    # Issue 25 item 5: the automatic bundle of `sim scenario arena` led with other processes' faults from the host's
    # kernel log. One such process, faulting for real just before (a stand-in engine nobody supervises), must be
    # listed as another process's, after canary3's crash.
    import os
    import signal
    from engines.preload_harness import engine_argv, standin_env
    assert cli("sim", "init", "--gpus", "4", "--vram", "8GiB").returncode == 0
    foreign = subprocess.run(engine_argv(standins, "dlopen"), env={**os.environ, **standin_env(tmp_path, fault_at=1)},
                             capture_output=True, timeout=30)
    assert foreign.returncode == -signal.SIGSEGV
    proc = cli("sim", "scenario", "arena", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Issue 33: every canary registers, then each one's pinned allocation fails and all four die of SIGSEGV.
    names = [f"canary{i}" for i in range(4)]
    wait_for(lambda: any(records(supervised).get(n, {}).get("bundle") for n in names), 60, "an automatic bundle")
    subject = next(n for n in names if records(supervised).get(n, {}).get("bundle"))
    bundle = records(supervised)[subject]["bundle"]
    doc = json.loads(cli("triage", bundle, "--json").stdout)
    assert doc["headline"].startswith(f"engine {subject} died of SIGSEGV after registering: hipHostMalloc of "
                                      "16.0 MiB returned hipErrorOutOfMemory"), doc["headline"]
    assert doc["subject"]["engine"] == subject
    assert doc["known_issues"][0]["id"] == "kfd-system-mem-limit-pinned-after-registration"
    assert "canary0-canary3 registered 4 x 64.0 MiB" in doc["known_issues"][0]["because"]
    others = [f for f in doc["findings"] if f["category"] == "segfault" and
              not any(v.get("engine") for v in f["victims"])]
    # Seen once under the full suite (other tests' crashes in the same kernel log): the message names the finding.
    odd = [{k: f.get(k) for k in ("scope", "title", "victims")} for f in others
           if not (f["scope"] == "other-process" and f"not {subject} nor another engine" in f["title"])]
    assert not odd, odd
    # The kernel rate-limits fault lines (printk_ratelimit), so the foreign one may be missing; when logged, it is
    # among the other processes' (the line is the real kernel's "engine_dlopen[pid]: segfault at 8 ... error 6").
    log = subprocess.run(["tar", "-xzOf", bundle, "--wildcards", "*/kernel/kernel.log"], capture_output=True).stdout
    if b"engine_dlopen[" in log:
        assert any(v.get("process") == "engine_dlopen" for f in others for v in f["victims"])
    from gpuwarden.tui.screens.engine_log import triage_headline
    assert triage_headline(Path(bundle), subject) == doc["headline"]
