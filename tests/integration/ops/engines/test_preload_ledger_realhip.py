"""The KFD ledger against ROCm 5.4's real HIP runtime (tests/helpers/realhip.py fetches it): its pinned-memory error paths.

This machine has no GPU (no /dev/kfd): the real hipHostMalloc & co fail their runtime initialisation and return an
error. The interposer must hand the engine that result unchanged and record it (call, bytes, flags, code), never
crash; reached through the program's own symbols, dlopen + dlsym, and dlvsym of ROCm's hip_4.2 version.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from engines.preload_harness import Engine, events, preload_env
from standins.preload_build import SOURCES

SIZE = 4 << 20
# ROCm 5.4 exports these (hip_4.2); hipExtHostAlloc came later.
CALLS = ["hipHostMalloc", "hipHostAlloc", "hipMallocHost", "hipMemAllocHost"]


@pytest.fixture(scope="module")
def real_pinned(real_hip: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("realhip-pinned")
    cc = os.environ.get("CC") or "cc"
    rpath = f"-Wl,-rpath,{real_hip}"
    for target, args in (
        ("pinned_linked", ["-DLINKED", "-DNO_EXT_HOST_ALLOC", rpath, f"-L{real_hip}", "-l:libamdhip64.so", "-ldl"]),
        ("pinned", [rpath, "-ldl"]),
    ):
        done = subprocess.run([cc, "-O1", "-Wall", "-o", str(out / target), str(SOURCES / "pinned.c"), *args],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return out


def _run(real_pinned: Path, mode: str, env: dict[str, str], work: Path) -> Engine:
    program = real_pinned / ("pinned_linked" if mode == "linked" else "pinned")
    engine = Engine([str(program), mode, str(SIZE)], {**env, "PINNED_BAD_FREE": "1"}, work)
    engine.proc.wait(60)
    return engine


def test_without_the_interposer_the_real_calls_fail(real_pinned, tmp_path):
    # The baseline: what the real runtime itself returns here, with nothing of ours loaded.
    engine = _run(real_pinned, "linked", {}, tmp_path)
    assert engine.proc.returncode == 0, engine.output
    assert all(f"alloc {c} returned 101" in engine.output for c in CALLS), engine.output


@pytest.mark.parametrize("mode,via", [("linked", "symbol"), ("dlsym", "dlsym"), ("dlvsym", "dlsym")])
def test_the_interposer_records_the_real_errors(mode, via, real_pinned, tmp_path):
    engine = _run(real_pinned, mode, preload_env(tmp_path, gate=False), tmp_path)
    assert engine.proc.returncode == 0, engine.output  # no crash of ours on the runtime's error path
    # The engine got the real result (hipErrorInvalidDevice: hsa_init fails without /dev/kfd).
    assert all(f"alloc {c} returned 101" in engine.output for c in CALLS), engine.output
    assert "bad free returned 101" in engine.output
    got = [e for e in events(tmp_path, engine.proc.pid) if e.phase.startswith("host-")]
    assert [e.phase for e in got] == ["host-alloc-failed"] * 4 + ["host-free-failed"], [e.data for e in got]
    assert [e.data["call"] for e in got] == [*CALLS, "hipHostFree"]
    for e in got[:4]:
        assert e.data["bytes"] == SIZE and e.data["result"] == 101 and e.data["via"] == via
        assert e.data["flags"] == (3 if e.data["call"] in ("hipHostMalloc", "hipHostAlloc") else None)
    assert got[-1].data["failed"] == 5 and got[-1].data["pinned_bytes"] == 0 and got[-1].data["allocs"] == 0
