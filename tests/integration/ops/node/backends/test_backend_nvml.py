"""The NVML backend: one clear line without a driver (real: this machine has no libnvidia-ml), and the
struct-to-GpuInfo mapping through a stand-in pynvml replaying captured `nvidia-smi -q` reports.
"""

from __future__ import annotations

import json
import subprocess
import sys



from gpuwarden.ops.node.backends.nvml import NvmlBackend
from gpuwarden.ops.sampling.sampler import take_snapshot
from standins import pynvml_standin as standin
from standins.nvsmi_capture import MIB, parse_q
H100X8_Q = "nvidia/nvidia_smi_q_text_8x_h100_sxm_565.txt"
H100_LOAD_Q = "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt"


def test_cli_forced_nvml_fails_with_one_line_and_exit_2(cli):
    proc = cli("--backend", "nvml", "status", "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["error"].endswith("nvml: libnvidia-ml.so.1 not found (no NVIDIA driver)")
    assert "Traceback" not in proc.stderr
    assert "nvml: libnvidia-ml.so.1 not found (no NVIDIA driver)" in proc.stderr


def test_snapshot_attributes_nvml_pids_to_real_processes_and_flags_a_dead_one(settings, fixtures):
    """The captured H100 load, with its three PIDs swapped for real processes: attribution, then one dies."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        gpus = parse_q(fixtures / H100_LOAD_Q)
        for proc, captured in zip(procs, gpus[0].processes):
            captured.pid = proc.pid
        backend = NvmlBackend(settings, module=standin.build(gpus))
        snap = take_snapshot(settings, backend)
        seen = {p.pid: p for p in snap.processes}
        assert [seen[p.pid].state for p in procs] == ["sleeping"] * 3
        assert all(seen[p.pid].command.startswith("sleep") and seen[p.pid].sources == {0: "nvml"} for p in procs)
        [res] = snap.residual
        assert res.accounted == (2566 + 1542 + 15690) * MIB
        assert res.residual == (19818 - 2566 - 1542 - 15690) * MIB and not res.significant
        # The 15.7 GB process is killed and reaped, but NVML still charges its PID: that VRAM is residual now.
        procs[2].kill()
        procs[2].wait()
        snap = take_snapshot(settings, backend)
        [res] = snap.residual
        assert res.significant and [h.pid for h in res.holders] == [procs[2].pid]
        assert snap.needs_attention()
        backend.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_process_holding_the_device_files_is_found_by_the_holder_scan(settings, fixtures, tmp_path):
    """A real process that opened (stand-in) /dev/nvidia0 and /dev/nvidiactl under the dev root, but that
    NVML does not list, still shows up as a GPU process holding them; /dev/nvidia-caps does not count."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl", "nvidia-caps"):
        (dev / name).write_text("")
    settings = settings.with_(dev_root=dev)
    opener = ("import sys; fs = [open(p) for p in sys.argv[1:]]; print('open', flush=True); sys.stdin.read()")
    paths = [str(dev / n) for n in ("nvidia0", "nvidiactl", "nvidia-caps")]
    child = subprocess.Popen([sys.executable, "-c", opener, *paths],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "open\n"
        backend = NvmlBackend(settings, module=standin.build(parse_q(fixtures / H100X8_Q)))
        snap = take_snapshot(settings, backend)
        backend.close()
        [proc] = [p for p in snap.processes if p.pid == child.pid]
        assert proc.device_files == (str(dev / "nvidia0"), str(dev / "nvidiactl"))
        assert proc.vram == {} and proc.alive
        assert snap.gpu(0).device_files == (str(dev / "nvidia0"),)
    finally:
        child.kill()
        child.wait()
