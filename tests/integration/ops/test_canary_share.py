"""The canary's shared-by-descriptor mode with real processes and a real unix socket (sim: memfd), and the hip
path's failure on ROCm 5.4's real libamdhip64.so (no GPU here).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path


from helpers.paths import REPO
from helpers.canary import make_arena, spawn, wait_phase

from gpuwarden.ops.foundation.status_protocol import read_events

SHM_NAME = "memfd:gpuwarden-arena-share"


def payload(arena: Path) -> bytes:
    from gpuwarden.ops.arena.mapping import MappedArena
    a = MappedArena(str(arena))
    try:
        return ctypes.string_at(a.payload_address, a.payload_size)
    finally:
        a.close()


def shared_bytes(pid: int, n: int) -> bytes:
    """What the process sees through the passed descriptor: read via its own fd (root, or the same user)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if SHM_NAME in os.readlink(f"/proc/{pid}/fd/{fd}"):
                with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
                    return f.read(n)
        except OSError:
            continue
    raise AssertionError(f"pid {pid} holds no {SHM_NAME} descriptor")


def maps_share(pid: int) -> bool:
    return SHM_NAME in Path(f"/proc/{pid}/maps").read_text()


def stop(*procs: subprocess.Popen) -> list[int | None]:
    codes = []
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            codes.append(p.wait(20))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(None)
    return codes


def test_keeper_loads_once_importers_map_it_and_survive_the_keeper(tmp_path, state_dir):
    from gpuwarden.ops.node.sim import registrations
    arena = make_arena(tmp_path / "a.arena")
    want = payload(arena)
    sock = str(tmp_path / "keeper.sock")
    keeper = spawn(arena, tmp_path / "k.status", state_dir, "--runtime", "sim", "--share", "keeper", "--share-socket", sock)
    procs = [keeper]
    try:
        kev = wait_phase(tmp_path / "k.status", "serving", keeper)
        assert [e.data.get("mode") for e in kev if e.phase == "verifying"] == ["full"]
        imp = spawn(arena, tmp_path / "i1.status", state_dir, "--runtime", "sim", "--gpu", "1",
                    "--share", "import", "--share-socket", sock)
        procs.append(imp)
        iev = wait_phase(tmp_path / "i1.status", "serving", imp)
        phases = [e.phase for e in iev]
        assert phases == ["starting", "mapping", "verifying", "registering", "registered", "serving"]
        ver = next(e for e in iev if e.phase == "verifying")
        # Verified once, in the keeper: the importer names the keeper instead of reading the file.
        assert ver.data["mode"] == "keeper" and ver.data["keeper_pid"] == keeper.pid
        assert next(e for e in iev if e.phase == "serving").data["gbps"] > 0
        assert maps_share(imp.pid) and shared_bytes(imp.pid, len(want)) == want
        # One charge for the node: the keeper's; the importer pins nothing of its own.
        assert registrations.charged(state_dir) == len(want)

        keeper.send_signal(signal.SIGKILL)
        keeper.wait(20)
        # The importer's mapping outlives the keeper.
        assert imp.poll() is None and shared_bytes(imp.pid, len(want)) == want
        late = subprocess.run([sys.executable, "-m", "gpuwarden.ops.canary", "--arena", str(arena), "--runtime", "sim",
                               "--share", "import", "--share-socket", sock], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "GPUWARDEN_STATE_DIR": str(state_dir)})
        assert late.returncode == 2 and "Traceback" not in late.stderr
        first = late.stderr.splitlines()[0]
        assert first == f"gpuwarden: error: no keeper is serving at {sock} (it exited; its socket is left over)"
        assert "--share keeper" in late.stderr

        # A restarted keeper takes over the dead one's socket; new importers join again.
        keeper2 = spawn(arena, tmp_path / "k2.status", state_dir, "--runtime", "sim", "--share", "keeper",
                        "--share-socket", sock)
        procs.append(keeper2)
        wait_phase(tmp_path / "k2.status", "serving", keeper2)
        imp2 = spawn(arena, tmp_path / "i2.status", state_dir, "--runtime", "sim", "--share", "import",
                     "--share-socket", sock)
        procs.append(imp2)
        i2 = wait_phase(tmp_path / "i2.status", "serving", imp2)
        assert next(e for e in i2 if e.phase == "verifying").data["keeper_pid"] == keeper2.pid
        assert shared_bytes(imp2.pid, len(want)) == want
        assert stop(imp, imp2, keeper2) == [0, 0, 0]
        assert not os.path.exists(sock), "a keeper that stopped cleanly leaves no socket"
        assert read_events(tmp_path / "k2.status")[-1].phase == "exited"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_second_keeper_and_wrong_arena_are_refused(tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena")
    other = make_arena(tmp_path / "b.arena")
    keeper = spawn(arena, tmp_path / "k.status", state_dir, "--runtime", "sim", "--share", "keeper")
    try:
        wait_phase(tmp_path / "k.status", "serving", keeper)
        sock = f"{arena.resolve()}.keeper.sock"
        assert os.path.exists(sock)  # the default: beside the arena
        env = {**os.environ, "GPUWARDEN_STATE_DIR": str(state_dir)}
        base = [sys.executable, "-m", "gpuwarden.ops.canary", "--runtime", "sim"]
        again = subprocess.run(base + ["--arena", str(arena), "--share", "keeper"], cwd=REPO, capture_output=True,
                               text=True, timeout=60, env=env)
        assert again.returncode == 2 and again.stderr.splitlines()[0] == \
            f"gpuwarden: error: a keeper is already serving at {sock}"
        wrong = subprocess.run(base + ["--arena", str(other), "--share", "import", "--share-socket", sock], cwd=REPO,
                               capture_output=True, text=True, timeout=60, env=env)
        assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
        assert wrong.stderr.splitlines()[0] == \
            f"gpuwarden: error: the keeper at {sock} serves {arena.resolve()}, not {other.resolve()}"
        assert stop(keeper) == [0]
    finally:
        keeper.kill()


def test_host_runtime_has_no_share_mode(cli, tmp_path):
    arena = make_arena(tmp_path / "a.arena")
    proc = cli("canary", "--arena", str(arena), "--runtime", "host", "--share", "keeper")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("gpuwarden: error: host: the host runtime has no shared-by-descriptor mode")


def test_hip_keeper_on_the_real_runtime_without_a_gpu_is_one_line(real_hip, tmp_path, state_dir):
    """hip-python loads the real libamdhip64.so (LD_LIBRARY_PATH); the canary fails at the first HIP call."""
    arena = make_arena(tmp_path / "a.arena")
    proc = spawn(arena, tmp_path / "k.status", state_dir, "--runtime", "hip", "--share", "keeper",
                 env={"LD_LIBRARY_PATH": str(real_hip)})
    assert proc.wait(60) == 2
    err = proc.stderr.read()
    assert "Traceback" not in err and err.startswith("gpuwarden: error: hip: no usable GPU here: hip"), err
    assert len([ln for ln in err.splitlines() if ln.startswith("gpuwarden: error:")]) == 1
    last = read_events(tmp_path / "k.status")[-1]
    assert last.phase == "exited" and last.data["code"] == 2


def test_hip_vmm_calls_reach_the_real_runtime(real_hip, tmp_path):
    """Past hipSetDevice: the VMM calls themselves, on the real library, fail as one RuntimeUnavailable."""
    code = ("from gpuwarden.ops.register.hip import HipRuntime\n"
            "from gpuwarden.ops.foundation.errors import GpuwardenError\n"
            "rt = HipRuntime(); rt.gpu = 0\n"
            "try:\n    rt.share_create(4 << 20)\nexcept GpuwardenError as exc:\n"
            "    print(type(exc).__name__, exc.exit_code, exc.message)\n"
            "try:\n    rt._check(rt._create(2 << 20, rt._prop()), 'creating')\nexcept GpuwardenError as exc:\n"
            "    print(type(exc).__name__, exc.exit_code, exc.message)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LD_LIBRARY_PATH": str(real_hip)})
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    granularity, create = out.stdout.strip().splitlines()
    assert granularity.startswith("RuntimeUnavailable 2 hip: no usable GPU here: asking the granularity failed: hipError")
    assert create.startswith("RuntimeUnavailable 2 hip: no usable GPU here: creating failed: hipError"), create
