"""The bundle's core-dump backtrace with each real tool (gdb, eu-stack) on a real core of a real crash.

The engine's spec is read as the supervisor writes it (settings under "engine"): the bundle once looked for
argv at the top level, gave gdb the core alone, and gdb then named no function (every frame "??").
tests/run-all.sh installs both tools, so neither branch is skipped in CI.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuwarden.ops.bundle import cores
from gpuwarden.ops.triage import backtrace
from helpers.paths import TESTS

HERE = TESTS / "engines"


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> tuple[dict, dict, Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the crashing stand-in engine")
    tmp = tmp_path_factory.mktemp("core")
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        pytest.skip(f"core_pattern {pattern!r} does not write the core into the working directory")
    lib, exe, work = tmp / "libgwcrash.so.7", tmp / "crash_engine", tmp / "work"
    work.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(HERE / "crash_lib.c")], check=True)
    subprocess.run([cc, "-O1", "-o", str(exe), str(HERE / "crash_engine.c"), str(lib), f"-Wl,-rpath,{tmp}"],
                   check=True)

    def allow_core() -> None:
        hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))

    # no go-file argument: the stand-in faults at once
    proc = subprocess.Popen([str(exe)], cwd=work, preexec_fn=allow_core, stdout=subprocess.DEVNULL)
    assert proc.wait(timeout=30) < 0
    if not list(work.glob("core*")):
        pytest.skip("the kernel wrote no core (RLIMIT_CORE hard limit 0 here?)")
    # as ops/engines writes spec.json and state.json
    spec = {"engine": {"name": "dp0", "argv": [str(exe)], "workdir": str(work)}, "gate_dir": str(tmp / "gate")}
    state = {"pid": proc.pid, "signal": "SIGSEGV"}
    return spec, state, work


@pytest.mark.parametrize("tool", ["gdb", "eu-stack"])
def test_core_backtrace_names_the_faulting_function(crashed, tool, monkeypatch):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed (tests/run-all.sh installs it)")
    other = {"gdb": "eu-stack", "eu-stack": "gdb"}[tool]
    real_which = shutil.which
    monkeypatch.setattr(cores.shutil, "which", lambda name, *a, **k: None if name in (other, "coredumpctl")
                        else real_which(name, *a, **k))
    spec, state, _ = crashed
    entries = cores.backtrace_entries("dp0", spec, state, Path("/proc"), time.monotonic() + 30)
    assert len(entries) == 1 and entries[0].data, [e.error for e in entries]
    text = entries[0].data.decode()
    assert text.startswith(f"# {tool} "), text[:200]
    frames = backtrace.parse(text)
    top = backtrace.crash_frame(frames)
    assert top is not None and top.function == "gw_register_arena", text
    assert top.module and top.module.endswith("libgwcrash.so.7"), text
    assert any(f.function == "main" for f in frames), text


def test_relative_argv0_is_found_in_the_workdir(crashed):
    spec, _, work = crashed
    rel = json.loads(json.dumps(spec))
    (work / "bin").mkdir(exist_ok=True)
    shutil.copy(spec["engine"]["argv"][0], work / "bin" / "engine")
    rel["engine"]["argv"] = ["./bin/engine"]
    assert cores._executable(rel) == str(work / "bin" / "engine")
    assert cores._executable({"engine": {"argv": []}}) is None
