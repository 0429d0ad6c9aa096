"""The amdsmi backend: one clear line without the library, and the contract with amdsmi 6.1, 6.2 and
7.0.2 checked through a stand-in built from each version's real signatures, replaying captured amd-smi output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwarden.ops.node.backends.amdsmi_backend import AmdSmiBackend
from gpuwarden.ops.sampling.sampler import take_snapshot
from standins import amd_smi_capture as capture
from standins import amdsmi_standin as standin

GIB = 1 << 30


def test_cli_forced_amdsmi_fails_with_one_line_and_exit_2(cli):
    proc = cli("--backend", "amdsmi", "status", "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # stdout holds the error document and nothing else (the wheel's own chatter must not leak there)
    assert json.loads(proc.stdout)["error"].endswith("amdsmi: libamd_smi.so not found")
    assert "Traceback" not in proc.stderr
    assert "amdsmi: libamd_smi.so not found" in proc.stderr
    assert proc.stderr.strip().splitlines()[0].startswith("gpuwarden: error:")


@pytest.mark.parametrize("version", ["rocm-6.1.0", "amdsmi-7.0.2"])
def test_snapshot_turns_a_zombie_holding_vram_into_residual(version, settings, fixtures, tmp_path):
    """The captured MI300X process, its PID swapped for a real child: alive it is accounted; once it
    has exited unreaped (a zombie still charged by the driver) its VRAM is residual with a named holder."""
    settings = settings.with_(sysfs_root=tmp_path / "sys", dev_root=tmp_path / "dev")
    node = capture.monitor_node(fixtures / "amd-smi/amd_smi_monitor_process_rocm640.txt")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        node.gpus[0].processes[0].pid = child.pid
        backend = AmdSmiBackend(settings, module=standin.build(version, node))
        snap = take_snapshot(settings, backend)
        [proc] = [p for p in snap.processes if p.pid == child.pid]
        assert proc.alive and proc.sources == {0: "amdsmi"}
        assert proc.vram[0] == pytest.approx(2.8 * GIB, abs=0.05 * GIB)
        [res] = snap.residual
        assert not res.significant and res.accounted == proc.vram[0]

        child.stdin.close()  # it exits; not waiting for it leaves a zombie
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _state(child.pid) != "Z":
            time.sleep(0.01)
        assert _state(child.pid) == "Z"
        snap = take_snapshot(settings, backend)
        [res] = snap.residual
        assert res.significant and res.accounted == 0
        assert [(h.pid, h.reason) for h in res.holders] == [(child.pid, "zombie")]
        backend.close()
    finally:
        child.kill()
        child.wait()


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
