"""A wedged GPU never wedges gpuwarden: every read of a GPU source runs under a deadline (issue 25 item 2).

The blocking reads are real: FIFOs without a writer, whose open blocks in the kernel (the sim's hang fault makes
its busy/temperature/power files such FIFOs). The CLI runs as a child process under a timeout that would catch a
hang; the agent as a real process; the TUI in tmux.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from helpers.agentnode import snapshot_of, start_agent
from helpers.paths import FIXTURES
from helpers.simnode import wait_for

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.foundation.deadline import LateRead, Lanes

GPUWARDEN = Path(sys.executable).parent / "gpuwarden"
HANG_LIMIT_S = 20  # a command that takes this long hangs (its deadline is 0.5 s)


def threads(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def resident_threads(pid: int) -> int:
    """The fewest threads seen over a burst of looks: the agent's per-connection handler threads come and go."""
    return min(threads(pid) for _ in range(300))


def blocking_read(path: Path):
    """A lane job that opens `path` for reading, blocking (a FIFO without a writer blocks in the kernel)."""
    def job(mark):
        mark(path.name, str(path))
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 64)
        finally:
            os.close(fd)
    return job


def release(fifo: Path) -> bool:
    """Let a reader blocked opening `fifo` go (it then reads end-of-file); False when none was waiting."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


# --- the lanes -----------------------------------------------------------------------------------------------
def test_a_late_read_is_named_and_its_lane_never_starts_a_second_thread(tmp_path):
    fifo = tmp_path / "gpu_busy_percent"
    os.mkfifo(fifo)
    lanes = Lanes()
    before = threads()
    t0 = time.monotonic()
    with pytest.raises(LateRead) as late:
        lanes.run("gpu2", blocking_read(fifo), 0.3, source="sysfs", gpu=2)
    assert 0.3 <= time.monotonic() - t0 < 2.0
    assert late.value.message == "GPU 2: sysfs read of gpu_busy_percent did not answer in 0.3 s: the GPU may be hung"
    assert late.value.path == str(fifo)
    # Every later call on the lane answers at once, with the same read and the time it began; no new thread.
    for _ in range(50):
        t1 = time.monotonic()
        with pytest.raises(LateRead) as again:
            lanes.run("gpu2", blocking_read(fifo), 0.3, source="sysfs", gpu=2)
        assert time.monotonic() - t1 < 0.1 and again.value.since == late.value.since
    assert threads() == before + 1 and lanes.threads() == 1 and len(lanes.blocked()) == 1
    assert release(fifo)  # the driver answers at last
    wait_for(lambda: lanes.poll("gpu2") is None, what="the lane to come free")
    plain = tmp_path / "plain"
    plain.write_text("42\n")
    assert lanes.run("gpu2", blocking_read(plain), 0.3, source="sysfs", gpu=2) == b"42\n"
    assert threads() == before + 1  # the same worker serves again


def test_latest_answers_with_the_last_complete_one_and_names_the_late_read(tmp_path):
    """What the backends' process lists use: a late read gives back the previous answer and the LateRead."""
    fifo = tmp_path / "vram_41000"
    os.mkfifo(fifo)
    plain = tmp_path / "plain"
    plain.write_text("7\n")
    lanes = Lanes()
    assert lanes.latest("kfd", blocking_read(plain), 0.3, b"none yet", source="kfd") == (b"7\n", ())
    answer, late = lanes.latest("kfd", blocking_read(fifo), 0.3, b"7\n", source="kfd")
    assert answer == b"7\n" and [r.path for r in late] == [str(fifo)]
    assert release(fifo)
    wait_for(lambda: lanes.poll("kfd") is None, what="the lane to come free")
    plain.write_text("8\n")
    assert lanes.latest("kfd", blocking_read(plain), 0.3, b"7\n", source="kfd") == (b"8\n", ())


def test_many_hung_gpus_cost_one_deadline_not_one_each(tmp_path):
    fifos = []
    for i in range(6):
        fifos.append(tmp_path / f"f{i}")
        os.mkfifo(fifos[-1])
    ok = tmp_path / "ok"
    ok.write_text("7\n")
    lanes = Lanes()
    jobs = [(i, blocking_read(f), "sysfs", i) for i, f in enumerate(fifos)] + [("ok", blocking_read(ok), "sysfs", 9)]
    t0 = time.monotonic()
    answers = lanes.run_all(jobs, 0.4)
    assert time.monotonic() - t0 < 1.2
    assert [type(a).__name__ for a in answers] == ["LateRead"] * 6 + ["bytes"] and answers[-1] == b"7\n"
    assert {a.gpu for a in answers[:6]} == set(range(6))
    for f in fifos:
        release(f)


# --- the sysfs backend on the sim node's tree ---------------------------------------------------------------
@pytest.fixture
def hung_node(state_dir):
    from gpuwarden.ops.node.sim.node import SimNode
    node = SimNode(state_dir)
    node.init(gpus=3, vram=8 << 30)
    node.allocate(os.getpid(), 1, 1 << 30)
    yield node
    node.set_fault("hang", False)  # let every reader still blocked go


def test_a_hung_gpu_is_stale_with_what_it_still_answers_and_threads_stay_bounded(hung_node):
    from gpuwarden.ops.node.backends.sysfs import SysfsBackend
    lanes = Lanes()
    backend = SysfsBackend(sysfs_root=hung_node.sysfs_root, dev_root=hung_node.dev_root, deadline_s=0.3, lanes=lanes)
    try:
        assert all(g.stale is None for g in backend.gpus())
        hung_node.set_fault("hang", True, [1])
        for g in range(3):
            backend._gpu_held[g].close()  # held files read the old inodes: a real driver's would block too
        gpus = backend.gpus()
        assert [g.stale is not None for g in gpus] == [False, True, False]
        stale = gpus[1].stale
        assert stale.what == "gpu_busy_percent" and stale.path.endswith("card1/device/gpu_busy_percent")
        assert stale.message == "GPU 1: sysfs read of gpu_busy_percent did not answer in 0.3 s: the GPU may be hung"
        assert gpus[1].vram_used == 1 << 30 and gpus[1].busy_percent is None  # the memory counter still answers
        assert gpus[0].busy_percent == 0 and gpus[0].temperature_c == 34.0
        # Refresh after refresh: one lane per hung file at most, then every refresh is quick.
        for _ in range(10):
            gpus = backend.gpus()
            assert gpus[1].stale.since == stale.since and gpus[1].vram_used == 1 << 30
        t0 = time.monotonic()
        backend.gpus()
        assert time.monotonic() - t0 < 0.2
        assert len(lanes.blocked()) == 3  # busy, temperature, power of GPU 1
        assert lanes.threads() <= 3 + 1 + 3  # those, a free one of GPU 1, one per healthy GPU
        assert {b.what for b in lanes.blocked()} == {"gpu_busy_percent", "temp1_input", "power1_average"}
        hung_node.set_fault("hang", False)
        wait_for(lambda: backend.gpus()[1].stale is None, what="GPU 1 to answer again")
        assert backend.gpus()[1].busy_percent == 12
    finally:
        backend.close()


def test_a_late_per_process_file_keeps_the_last_answer_and_makes_residual_unknown(hung_node, state_dir):
    from gpuwarden.ops.node.backends.sysfs import SysfsBackend
    from gpuwarden.ops.sampling.sampler import Sampler
    from gpuwarden.ops.foundation.settings import Settings
    backend = SysfsBackend(sysfs_root=hung_node.sysfs_root, dev_root=hung_node.dev_root, deadline_s=0.3,
                           lanes=Lanes())
    sampler = Sampler(Settings(state_dir=state_dir), backend, use_pidfds=False)
    try:
        first = sampler.snapshot(deep=True)
        assert first.processes and first.processes[0].vram == {1: 1 << 30}
        vram = hung_node.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}/vram_{hung_node.gpu_id(1)}"
        vram.unlink()
        os.mkfifo(vram)
        backend._held.close()
        backend._repeat = None
        backend.RELIST_EVERY = 1  # list the directory again now: the FIFO is a new file
        snap = sampler.snapshot()
        assert snap.processes[0].vram == {1: 1 << 30}  # the last complete answer
        assert all(r.residual is None and not r.significant for r in snap.residual)
        [w] = [w for w in snap.warnings if w.code == "stale"]
        assert f"kfd read of {os.getpid()}/vram_{hung_node.gpu_id(1)} did not answer in 0.3 s" in w.message
        assert "residual VRAM is unknown" in w.message
        release(vram)
        vram.unlink()
        vram.write_text(f"{1 << 30}\n")  # the sim driver rewrites its own files in place
    finally:
        sampler.close()


def test_nvml_call_that_blocks_names_the_call_and_leaves_the_other_gpus(settings, tmp_path):
    from standins import pynvml_standin as standin
    from standins.nvsmi_capture import parse_q
    from gpuwarden.ops.node.backends.nvml import NvmlBackend
    mod = standin.build(parse_q(FIXTURES / "nvidia/nvidia_smi_q_text_8x_h100_sxm_565.txt"))
    fifo = tmp_path / "wedged"
    os.mkfifo(fifo)
    real = mod.nvmlDeviceGetUtilizationRates

    def nvmlDeviceGetUtilizationRates(handle):
        if handle.index == 3:
            os.close(os.open(fifo, os.O_RDONLY))  # blocks in the kernel, as a call into a wedged GPU does
        return real(handle)
    mod.nvmlDeviceGetUtilizationRates = nvmlDeviceGetUtilizationRates
    # Opened under the usual deadline: on two busy cores, opening eight stand-in GPUs once overran 0.3 s in CI.
    backend = NvmlBackend(settings.with_(dev_root=tmp_path), module=mod)
    backend.deadline_s = 1.0
    try:
        t0 = time.monotonic()
        gpus = backend.gpus()
        assert time.monotonic() - t0 < 3.0  # one deadline for the eight GPUs, not one each
        assert [g.index for g in gpus if g.stale] == [3]
        assert gpus[3].stale.message == ("GPU 3: nvml read of nvmlDeviceGetUtilizationRates did not answer in 1 s: "
                                         "the GPU may be hung")
        assert gpus[3].name == gpus[2].name and gpus[3].vram_used is None and gpus[2].vram_used is not None
    finally:
        release(fifo)
        backend.close()


def test_a_stale_snapshot_validates_against_the_schema_readers_had_before(hung_node, state_dir):
    import jsonschema
    from gpuwarden.ops.foundation.model import snapshot_from_dict
    from gpuwarden.ops.sampling.sampler import take_snapshot
    from gpuwarden.ops.foundation.settings import Settings
    hung_node.set_fault("hang", True, [2])
    snap = take_snapshot(Settings(state_dir=state_dir, backend="sim", read_timeout_s=0.3))
    doc = json.loads(snap.to_json())
    jsondoc.validate(doc)
    old = json.loads((FIXTURES / "schemas/snapshot.v1.before-deadlines.json").read_text())
    # A reader built before deadlines reads the stale GPUs as before, the whole document: the driver's own books
    # (added in the same release) sit inside each GPU record, which that schema leaves open, not at its closed
    # top level; each process's load likewise.
    assert "driver" not in doc and doc["gpus"][0]["driver"]["debugfs"]
    jsonschema.validate(doc, old)
    assert snapshot_from_dict(doc).gpu(2).stale == snap.gpu(2).stale
    assert doc["gpus"][2]["stale"]["since_iso"].endswith("Z") and doc["needs_attention"] is True


# --- the CLI, as the operator runs it -----------------------------------------------------------------------
@pytest.fixture
def hung_cli(cli, state_dir):
    assert cli("sim", "init", "--gpus", "4", "--vram", "8GiB").returncode == 0
    assert cli("sim", "fault", "hang", "on", "--gpu", "2").returncode == 0

    def run(*args, **kw):
        t0 = time.monotonic()
        proc = cli("--backend", "sim", "--read-timeout", "0.5", *args, timeout=HANG_LIMIT_S, **kw)
        proc.seconds = time.monotonic() - t0
        return proc
    yield run
    cli("sim", "fault", "hang", "off")


def test_status_answers_names_the_gpu_and_exits_1(hung_cli):
    proc = hung_cli("status")
    assert proc.returncode == 1 and proc.seconds < 8, (proc.seconds, proc.stdout, proc.stderr)
    assert "GPU 2: sysfs read of gpu_busy_percent did not answer in 0.5 s: the GPU may be hung" in proc.stdout
    assert "SIMULATED" in proc.stdout and "NEEDS ATTENTION" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("  2 "))
    assert "STALE (gpu_busy_percent" in row and "8.0 GiB" in row  # what it has: VRAM still reads
    proc = hung_cli("status", "--json")
    assert proc.returncode == 1 and proc.seconds < 8
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert [g["index"] for g in doc["gpus"] if g["stale"]] == [2]
    assert {"code": "stale", "gpu": 2,
            "message": "GPU 2: sysfs read of gpu_busy_percent did not answer in 0.5 s: the GPU may be hung"} \
        in doc["warnings"]


def test_status_of_a_hung_node_stays_in_the_import_budget(hung_cli, state_dir):
    from helpers.cli_imports import HEAVY_STDLIB, bare_python, imported, over_budget
    names, proc = imported(state_dir, "--backend", "sim", "--read-timeout", "0.5", "status", "--json")
    assert proc.returncode == 1 and '"stale":{' in proc.stdout, proc.stderr[-2000:]
    assert over_budget(names) == [] and over_budget(names - bare_python(), HEAVY_STDLIB) == []


def test_metrics_exports_what_answers_and_names_the_stale_gpu(hung_cli):
    proc = hung_cli("metrics")
    assert proc.returncode == 1 and proc.seconds < 8, proc.stderr
    assert "gpuwarden: GPU 2: sysfs read of gpu_busy_percent did not answer in 0.5 s" in proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("gpuwarden_gpu_stale{") and 'gpu="2"' in line and line.endswith(" 1.0") for line in lines)
    assert any(line.startswith("gpuwarden_gpu_busy_ratio{") and 'gpu="0"' in line for line in lines)
    assert not any(line.startswith("gpuwarden_gpu_busy_ratio{") and 'gpu="2"' in line for line in lines)
    assert any(line.startswith("gpuwarden_gpu_vram_used_bytes{") and 'gpu="2"' in line for line in lines)


def test_doctor_names_the_gpu_that_does_not_answer(hung_cli):
    proc = hung_cli("doctor", "--only", "gpu-answers", "--json")
    assert proc.returncode == 1 and proc.seconds < 10, proc.stderr
    [check] = json.loads(proc.stdout)["checks"]
    assert check["verdict"] == "fail"
    assert check["reason"] == "GPU 2: sysfs read of gpu_busy_percent did not answer in 0.5 s: the GPU may be hung"
    assert "gpuwarden reset 2 --force" in check["fix"]


def test_fix_and_reset_refuse_a_gpu_whose_state_could_not_be_read(hung_cli, state_dir):
    proc = hung_cli("fix", "2", "--yes")
    assert proc.returncode == 1 and proc.seconds < 10
    assert "GPU 2's state could not be read: sysfs read of gpu_busy_percent did not answer in 0.5 s" in proc.stdout
    proc = hung_cli("reset", "2", "--yes")
    assert proc.returncode == 1 and "(pass --force to reset it all the same)" in proc.stdout
    assert json.loads(hung_cli("sim", "show", "--json").stdout)["resets"] == {}  # nothing was reset
    assert hung_cli("fix", "1", "--dry-run").returncode == 0  # the GPUs that answer are not held hostage
    # The operator who knows: a forced reset goes ahead, and the reset brings the GPU back.
    proc = hung_cli("reset", "2", "--force", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hung_cli("status").returncode == 0


def test_read_timeout_is_checked(cli, state_dir):
    assert cli("sim", "init", "--gpus", "1").returncode == 0
    for value in ("0", "nan", "soon"):
        proc = cli("--backend", "sim", "--read-timeout", value, "status")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "read-timeout" in proc.stderr
    proc = cli("--backend", "sim", "status", env={"GPUWARDEN_READ_TIMEOUT": "never"})
    assert proc.returncode == 2 and "GPUWARDEN_READ_TIMEOUT='never' is not a number" in proc.stderr
    assert "--read-timeout SECONDS" in cli("--help").stdout


# --- the agent ----------------------------------------------------------------------------------------------
def test_the_agent_keeps_sampling_names_the_late_gpu_and_holds_its_threads(cli, state_dir):
    assert cli("sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    agent = start_agent(state_dir, "--read-timeout", "0.5")
    hung = False
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
        assert cli("sim", "fault", "hang", "on", "--gpu", "1").returncode == 0
        hung = True
        snap = wait_for(lambda: (s := snapshot_of(agent))["gpus"][1]["stale"] and s, timeout=15, what="GPU 1 stale")
        assert snap["agent"]["stale"] is False and snap["gpus"][0]["busy_percent"] == 0  # sampling goes on
        assert snap["gpus"][1]["stale"]["what"] == "gpu_busy_percent" and snap["gpus"][1]["vram_used"] is not None
        assert agent.get("/healthz").status == 200  # the agent is healthy; the GPU is not (a restart cures nothing)
        taken = snapshot_of(agent)["taken_at"]
        # By then each of GPU 1's three wedged files holds its lane's thread (one new wait per refresh).
        wait_for(lambda: snapshot_of(agent)["taken_at"] > taken + 3, what="fresh snapshots while GPU 1 hangs")
        count = resident_threads(agent.proc.pid)
        wait_for(lambda: snapshot_of(agent)["taken_at"] > taken + 7, what="more refreshes")
        # No new thread per refresh for the same files: a leak adds one a refresh (4 by now); one thread the agent
        # starts once, late on a loaded machine (CI saw 13 -> 14), is not that.
        assert resident_threads(agent.proc.pid) <= count + 1
        proc = cli("--backend", "sim", "status", timeout=HANG_LIMIT_S)
        assert proc.returncode == 1 and "via agent" in proc.stdout
        assert "GPU 1: sysfs read of gpu_busy_percent did not answer in 0.5 s" in proc.stdout
        texts = [e["text"] for e in agent.json("/v1/events")["events"]]
        assert sum("GPU 1: sysfs read of gpu_busy_percent did not answer" in t for t in texts) == 1  # said once
        assert cli("sim", "fault", "hang", "off").returncode == 0
        hung = False
        wait_for(lambda: snapshot_of(agent)["gpus"][1]["stale"] is None, timeout=15, what="GPU 1 answers again")
        wait_for(lambda: any("GPU 1: its driver answers again" in e["text"]
                             for e in agent.json("/v1/events")["events"]), what="the event")
    finally:
        if hung:
            cli("sim", "fault", "hang", "off")
        agent.stop()


# --- the TUI, in a real terminal ----------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (tests/run-all.sh installs it)")
def test_the_tui_shows_every_panel_names_the_stale_gpu_and_keeps_the_simulated_label(cli, state_dir, tmp_path):
    from helpers.tui_terminal import Tmux
    assert cli("sim", "init", "--gpus", "3", "--vram", "8GiB").returncode == 0
    assert cli("sim", "leak", "--gpu", "0", "--size", "2GiB").returncode == 0
    assert cli("sim", "fault", "hang", "on", "--gpu", "1").returncode == 0
    tmux = Tmux(tmp_path / "tmux.sock")
    try:
        tmux.start(f"{GPUWARDEN} --state-dir {state_dir} --backend sim --read-timeout 0.5 tui --refresh 0.5; "
                   "sleep 60", height=36)
        text = tmux.wait_screen("GPU 1: sysfs read of gpu_busy_percent")  # the Events panel names it
        assert "SIMULATED" in text and "Engines" in text and "no engines supervised" in text and "Arena" in text
        row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("1 "))
        assert ("STALE" in row or "STL" in row) and "0.0/8Gi" in row, row  # marked, and its VRAM still shows
        assert "2.0Gi" in text  # GPU 0's residual: the other panels show what they have
        tmux.keys("q")
    finally:
        tmux.kill()
        cli("sim", "fault", "hang", "off")


def test_a_sole_process_is_not_given_its_late_gpus_old_figures(settings, tmp_path):
    """A GPU with one process gives it the GPU's own busy figure; when that GPU's read is late, the process's GPU%
    is unknown for the refresh, not the last refresh's figure passed off as this one's."""
    from standins import pynvml_standin as standin
    from standins.nvsmi_capture import parse_q
    from gpuwarden.ops.node.backends.nvml import NvmlBackend
    gpus = parse_q(FIXTURES / "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt")
    gpus[0].processes[:] = gpus[0].processes[:1]
    pid = gpus[0].processes[0].pid
    mod = standin.build(gpus)
    fifo = tmp_path / "wedged"
    os.mkfifo(fifo)
    real, wedged = mod.nvmlDeviceGetUtilizationRates, []

    def nvmlDeviceGetUtilizationRates(handle):
        if wedged:
            os.close(os.open(fifo, os.O_RDONLY))
        return real(handle)
    mod.nvmlDeviceGetUtilizationRates = nvmlDeviceGetUtilizationRates
    backend = NvmlBackend(settings.with_(dev_root=tmp_path), module=mod)  # the usual deadline until it wedges
    try:
        busy = backend.gpus()[0].busy_percent
        backend.process_usage()
        loads = backend.process_utilisation()
        assert loads is not None and loads[0][pid][0] == busy
        wedged.append(True)
        backend.deadline_s = 0.3
        assert backend.gpus()[0].stale is not None
        assert [u.pid for u in backend.process_usage()] == [pid]
        loads = backend.process_utilisation()
        assert loads is None or pid not in loads.get(0, {})
    finally:
        release(fifo)
        backend.close()
