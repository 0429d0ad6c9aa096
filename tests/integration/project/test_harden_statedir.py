"""Nothing planted in the state dir turns gpuwarden (root) into a file clobberer: a symlink test for every
file it writes, directory symlinks, state dirs that are not ours or that others can write.

Each test plants a real symlink (or FIFO) where gpuwarden keeps a file, makes gpuwarden write there
through its real code path, and checks the victim outside the state dir is untouched.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.cli import gpuwarden
from gpuwarden.ops.foundation import gate, gpulock, journal, statedir
from gpuwarden.ops.node import nodestate
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings

VICTIM_TEXT = b"precious: must survive\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_bytes(VICTIM_TEXT)
    return v


def untouched(victim: Path) -> bool:
    return victim.read_bytes() == VICTIM_TEXT and not victim.is_symlink()


def plant(link: Path, victim: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)


def _sim(state: Path) -> None:
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(state).init(gpus=2, vram=1 << 30)


def _engine_spec(state: Path) -> None:
    from gpuwarden.ops.engines import control
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    control.write_spec(Settings(state_dir=state), EngineConfig(name="e0", argv=("/bin/true",)), gate_slots=1,
                       registration_timeout=5, workdir=None, launch_id="t", vendor="amd")


def _engine_log(state: Path) -> None:
    from gpuwarden.ops.engines.logs import CappedLog
    (state / "engines" / "e0").mkdir(parents=True, exist_ok=True)
    log = CappedLog(state / "engines" / "e0" / "engine.log", 1 << 20)
    try:
        log.write(b"hello\n")
    finally:
        log.close()


def _engine_state(state: Path) -> None:
    statedir.write_json(state / "engines" / "e0" / "state.json", {"name": "e0", "phase": "exited"}, root=state)


def _auto_claim(state: Path) -> None:
    from gpuwarden.ops.bundle import auto
    auto._claim(Settings(state_dir=state), 0)


def _registration(state: Path) -> None:
    from gpuwarden.ops.node.sim import registrations
    registrations.add(state, gpu=0, size=4096, address=0x1000, path=None)


def _lock(state: Path) -> None:
    with gpulock.hold(state, [1], "test"):
        pass


def _slot(state: Path) -> None:
    gate.acquire(state / "gate", 1, who="test", timeout_s=1).release()


def _sim_sync(state: Path) -> None:
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(state).sync()


def _sim_allocate(state: Path) -> None:
    from gpuwarden.ops.node.sim.node import SimNode
    SimNode(state).allocate(os.getpid(), 0, 4096)


def _after_sim(rel: str, write):
    """A writer of a file the sim node made: the node exists first, then the file becomes a link."""
    def run(state: Path) -> None:
        write(state)
    run.needs_sim = True
    return rel, run


# (what gpuwarden writes, relative to the state dir; how to make it write there)
WRITERS = [
    ("journal.log", lambda s: journal.write(s, "test", "ok")),
    ("locks/gpu-1.lock", _lock),
    ("gate/slot-0.lock", _slot),
    ("drained.json", lambda s: nodestate.set_drained(s, 1, True, who="t")),
    ("baseline.json", lambda s: nodestate.set_baseline(s, {0: 1}, "sim")),
    ("engines/e0/spec.json", _engine_spec),
    ("engines/e0/state.json", _engine_state),
    ("engines/e0/engine.log", _engine_log),
    ("bundles/.auto.lock", _auto_claim),
    ("bundles/.auto.last", _auto_claim),
    ("sim/node.json", _sim),
    ("sim/.lock", _sim),
    ("sim/registrations/%d-0-1000.json" % os.getpid(), _registration),
    _after_sim("sim/root/sys/class/drm/card0/device/mem_info_vram_used", _sim_sync),
    _after_sim("sim/root/sys/class/drm/card1/device/hwmon/hwmon0/temp1_input", _sim_sync),
    _after_sim("sim/allocs/%d-%d-0.json", _sim_allocate),
]


def _writer_id(rel: str) -> str:
    # The same on every collection (pytest-xdist's workers must agree): no PID in a test's name.
    return re.sub(r"%d|\d{3,}", "N", rel.split("/")[-1])


@pytest.mark.parametrize("rel, write", WRITERS, ids=[_writer_id(w[0]) for w in WRITERS])
def test_a_symlinked_state_file_never_redirects_a_write(state_dir, victim, rel, write):
    if getattr(write, "needs_sim", False):
        _sim(state_dir)
        from gpuwarden.ops.node.procs import identity
        rel = rel % (os.getpid(), identity(os.getpid())) if "%d" in rel else rel
        (state_dir / rel).unlink(missing_ok=True)
    plant(state_dir / rel, victim)
    try:
        write(state_dir)
    except GpuwardenError as exc:  # refusing is fine, as long as it says why
        assert "symbolic link" in exc.message, exc.message
    assert untouched(victim)


@pytest.mark.parametrize("sub", ["locks", "bundles", "engines", "gate", "sim"])
def test_a_symlinked_state_subdir_is_refused(state_dir, tmp_path, victim, sub):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (state_dir / sub).symlink_to(elsewhere)
    writers = {"locks": _lock, "bundles": _auto_claim, "engines": _engine_spec, "gate": _slot, "sim": _sim}
    with pytest.raises(GpuwardenError) as err:
        writers[sub](state_dir)
    assert "symbolic link" in err.value.message
    assert os.listdir(elsewhere) == []


def test_a_planted_fifo_is_refused_not_waited_on(state_dir):
    os.mkfifo(state_dir / "baseline.json")
    proc = gpuwarden("--state-dir", str(state_dir), "baseline", "show", timeout=30)
    assert proc.returncode == 2 and "is not a regular file (a FIFO)" in proc.stderr, proc.stderr


def test_drain_through_a_symlinked_lock_truncates_nothing(cli, state_dir, victim):
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    plant(state_dir / "locks" / "gpu-1.lock", victim)
    proc = cli("--backend", "sim", "drain", "1", "--yes", "--timeout", "1")
    assert untouched(victim)
    assert "Traceback" not in proc.stderr
    assert "symbolic link" in proc.stdout + proc.stderr


def test_journal_and_engine_log_never_append_through_a_link(state_dir, victim):
    plant(state_dir / "journal.log", victim)
    with pytest.raises(GpuwardenError, match="symbolic link"):
        journal.write(state_dir, "test", "ok")
    assert untouched(victim)


def test_bundles_dir_symlink_gets_no_bundle(cli, state_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (state_dir / "bundles").symlink_to(elsewhere)
    proc = cli("--backend", "sim", "bundle", "--safe-mode", "--timeout", "3")
    assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("mode", [0o777, 0o722, 0o1777])
def test_a_state_dir_others_can_write_is_refused(tmp_path, mode):
    state = tmp_path / "shared"
    state.mkdir()
    os.chmod(state, mode)
    proc = gpuwarden("--state-dir", str(state), "journal", env={})
    assert proc.returncode == 2 and "writable by other users" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 2


def test_a_subdir_others_can_write_is_refused(state_dir):
    (state_dir / "locks").mkdir(mode=0o700)
    os.chmod(state_dir / "locks", 0o777)
    with pytest.raises(GpuwardenError, match="writable by other users"):
        _lock(state_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_subdir_of_another_user_is_refused(state_dir):
    (state_dir / "engines").mkdir()
    os.chown(state_dir / "engines", 65534, 65534)
    with pytest.raises(GpuwardenError, match="belongs to nobody"):
        _engine_spec(state_dir)


def test_engine_names_cannot_climb_out(cli, state_dir):
    from gpuwarden.ops.engines import state as st
    with pytest.raises(GpuwardenError, match="cannot name a file in the state dir"):
        st.read_state(state_dir, "../../etc")
    proc = cli("engines", "stop", "../../etc")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_state_files_are_private(state_dir):
    _engine_spec(state_dir)
    journal.write(state_dir, "test", "ok")
    for rel in ("engines/e0/spec.json", "journal.log"):
        assert stat.S_IMODE((state_dir / rel).stat().st_mode) == 0o600, rel
    for rel in ("engines", "engines/e0"):
        assert stat.S_IMODE((state_dir / rel).stat().st_mode) == 0o700, rel


def test_shim_status_file_link_is_replaced_not_followed(tmp_path, victim):
    """The shim truncates the engine's status file when it starts: through a link that was a victim."""
    from engines.harness import write_config
    state = tmp_path / "state"
    state.mkdir()
    cfg = write_config(tmp_path / "node.toml", 1, register_s=0.1)
    plant(state / "engines" / "e0" / "status.jsonl", victim)
    plant(state / "engines" / "e0" / "shim.log", victim)
    proc = subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state), "--config", str(cfg),
                           "launch"], cwd=REPO, capture_output=True, text=True, timeout=60)
    try:
        assert untouched(victim)
        assert "Traceback" not in proc.stderr
    finally:
        subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state), "engines", "stop",
                        "--all"], cwd=REPO, capture_output=True, timeout=60)
