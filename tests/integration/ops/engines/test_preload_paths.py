"""The interposer catches every way an unmodified engine reaches a register call (README's coverage table).

Each engine runs the real libgwpreload.so against stand-in runtimes; `via` in its events says which path it took.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from helpers.paths import REPO
from engines.preload_harness import (C_MODES, SIZE, Engine, calls, engine_argv, events, phases, preload_env,
                                     standin_env)

# mode -> (the call the engine made, how the interposer got in the way)
EXPECTED = {
    "linked": ("hipHostRegister", "symbol"),          # DT_NEEDED: the dynamic linker binds to our export
    "dlopen": ("hipHostRegister", "dlsym"),           # dlopen + dlsym(handle): our dlsym wraps the answer
    "ctypes": ("hipHostRegister", "dlsym"),           # ctypes.CDLL is dlopen + dlsym
    # torch.cuda.cudart().cudaHostRegister: libtorch_python.so calls cudaHostRegister, bound to our export;
    # its libcudart is not global (Python loads torch._C RTLD_LOCAL), so the real one is the caller's dependency
    "torchlike": ("cudaHostRegister", "symbol"),
    "hipproc": ("hipHostRegister", "procaddress"),    # hipGetProcAddress
    "cuproc": ("cuMemHostRegister", "procaddress"),   # cuGetProcAddress_v2 (the driver API)
    "cudart": ("cudaHostRegister", "dlsym"),          # runtime -> driver: one gated call, not two
    "deepbind": ("hipHostRegister", "deepbind"),      # RTLD_DEEPBIND library: its GOT is patched
    "deepdlsym": ("hipHostRegister", "dlsym"),        # ... and its own dlsym is ours again
}


@pytest.mark.parametrize("mode", [*C_MODES, "ctypes", "torchlike"])
def test_every_path_is_gated_and_reported(mode, standins, tmp_path):
    engine = Engine(engine_argv(standins, mode), {**standin_env(tmp_path), **preload_env(tmp_path)}, tmp_path)
    try:
        engine.wait_output("serving")
    finally:
        assert engine.stop() == 0, engine.output
    pid = engine.proc.pid
    call, via = EXPECTED[mode]
    assert "register returned 0" in engine.output and "unregister returned 0" in engine.output
    assert phases(tmp_path, pid) == ["registering", "registered", "unregistering", "unregistered"]
    registered = next(e for e in events(tmp_path, pid) if e.phase == "registered")
    assert registered.data["call"] == call and registered.data["via"] == via
    assert registered.data["bytes"] == SIZE and registered.data["result"] == 0 and registered.data["slot"] == 0
    # The stand-in ran the call once (the runtime's nested driver call went through ungated, not twice gated).
    served = calls(tmp_path / "standin")
    assert [(c["pid"], c["bytes"]) for c in served] == [(pid, SIZE)]
    # "seconds" is the real call alone: what the stand-in measured, give or take the clock reads.
    assert abs(registered.data["seconds"] - (served[0]["end"] - served[0]["start"])) < 0.05


def test_small_registrations_pass_straight_through(standins, tmp_path):
    engine = Engine(engine_argv(standins, "linked", size=1 << 20),
                    {**standin_env(tmp_path), **preload_env(tmp_path)}, tmp_path)
    engine.wait_output("serving")
    assert engine.stop() == 0
    assert phases(tmp_path) == []  # nothing gated, nothing reported...
    assert len(calls(tmp_path / "standin")) == 1  # ...and the call itself still happened
    assert not (tmp_path / "gate").exists()


def test_threshold_comes_from_the_environment(standins, tmp_path):
    env = {**standin_env(tmp_path), **preload_env(tmp_path, GPUWARDEN_PRELOAD_THRESHOLD=str(1 << 20))}
    engine = Engine(engine_argv(standins, "linked", size=1 << 20), env, tmp_path)
    engine.wait_output("serving")
    assert engine.stop() == 0
    assert "registered" in phases(tmp_path)


def test_another_preloaded_library_still_gets_rtld_next_right(standins, tmp_path):
    # libnext wraps getpid through dlsym(RTLD_NEXT); the engine prints its pid, -1 if RTLD_NEXT went wrong.
    env = {**standin_env(tmp_path), **preload_env(tmp_path)}
    env["LD_PRELOAD"] += f" {standins / 'libnext.so'}"
    engine = Engine(engine_argv(standins, "dlopen"), env, tmp_path)
    engine.wait_output("serving")
    assert engine.stop() == 0
    assert f"engine pid {engine.proc.pid} starting" in engine.output
    assert "registered" in phases(tmp_path, engine.proc.pid)


def test_without_a_gate_it_only_reports(standins, tmp_path):
    engine = Engine(engine_argv(standins, "dlopen"), {**standin_env(tmp_path), **preload_env(tmp_path, gate=False)},
                    tmp_path)
    engine.wait_output("serving")
    assert engine.stop() == 0
    registered = next(e for e in events(tmp_path) if e.phase == "registered")
    assert registered.data["slot"] is None and registered.data["wait_s"] == 0
    assert not (tmp_path / "gate").exists()


@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
                    reason="needs gcc-aarch64-linux-gnu and qemu-user (apt-get install them to check aarch64)")
def test_the_aarch64_build_catches_the_same_paths(manylinux_wheel, tmp_path):
    # The dlsym/dlopen entry points are assembly; the aarch64 ones run here under qemu-user. The library is
    # the one the aarch64 wheel ships (zig, glibc 2.17: the session's wheel), else the cross gcc's.
    import zipfile

    from standins.preload_build import build
    cc = "aarch64-linux-gnu-gcc"
    lib = tmp_path / "libgwpreload.so"
    native = REPO / "native"
    wheel = manylinux_wheel("aarch64")
    if wheel is not None:
        with zipfile.ZipFile(wheel) as z:
            lib.write_bytes(z.read("gpuwarden/ops/engines/libgwpreload.so"))
    else:
        subprocess.run([cc, "-O2", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-shared", "-Wl,-z,now",
                        f"-I{native}", "-o", str(lib), *map(str, sorted(native.glob("*.c"))), "-ldl", "-lpthread"],
                       check=True)
    old = os.environ.get("CC")
    os.environ["CC"] = cc
    try:
        libs = build(tmp_path / "lib")
    finally:
        os.environ.pop("CC") if old is None else os.environ.__setitem__("CC", old)
    # dlsym and dlopen (with RTLD_DEEPBIND) are the assembly entry points; libnext checks RTLD_NEXT.
    for mode, via in (("dlopen", "dlsym"), ("deepbind", "deepbind")):
        work = tmp_path / mode
        env = {**standin_env(work, register_ms=20), **preload_env(work), "QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu",
               "QEMU_SET_ENV": f"LD_PRELOAD={lib} {libs / 'libnext.so'}"}
        env.pop("LD_PRELOAD")  # for the emulated program only, not for qemu itself
        engine = Engine(["qemu-aarch64", *engine_argv(libs, mode)], env, work)
        engine.wait_output("serving", timeout=60)
        assert engine.stop(timeout=30) == 0, engine.output
        registered = next(e for e in events(work) if e.phase == "registered")
        assert registered.data["via"] == via and registered.data["bytes"] == SIZE
        assert "engine pid -1" not in engine.output  # libnext's RTLD_NEXT still right


def test_a_failed_registration_is_reported_with_its_result(standins, tmp_path):
    env = {**standin_env(tmp_path), **preload_env(tmp_path), "STANDIN_RESULT": "1061"}
    engine = Engine(engine_argv(standins, "dlopen"), env, tmp_path)
    engine.wait_output("serving")
    assert engine.stop() == 0
    assert "register returned 1061" in engine.output
    assert phases(tmp_path)[:2] == ["registering", "register-failed"]
    failed = next(e for e in events(tmp_path) if e.phase == "register-failed")
    assert failed.data["result"] == 1061 and failed.data["bytes"] == SIZE
    # Never registered, so its unregistration is not gated or reported either.
    assert "unregistering" not in phases(tmp_path)
