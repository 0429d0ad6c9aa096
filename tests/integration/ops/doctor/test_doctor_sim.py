"""`gpuwarden doctor` end to end on the simulated node: healthy, then with faults planted (a /dev/shm smaller than
the arena, memlock 64 KiB, a link at x8 of x16, mismatched firmware, an uncorrectable RAS count), then the same
node read back from a bundle that `gpuwarden bundle` made. Real CLI processes; the sim node's tree is real files.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers.paths import REPO
from gpuwarden.ops.foundation import jsondoc

GPU_CHECKS = "firmware,xgmi-hive,ras,pcie-link,large-bar,gpu-recovery,lockup-timeout,kfd-limit,gtt"
ARENA_CHECKS = "arena-fs,memlock,kfd-budget"


def run(state_dir: Path, *args: str, memlock: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    def limit() -> None:  # the limit engines launched from that shell would inherit
        if memlock is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            fits = hard == resource.RLIM_INFINITY or (memlock != resource.RLIM_INFINITY and memlock <= hard)
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock if fits else hard, hard))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    return subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir), "--backend", "sim",
                           "--config", str(state_dir / "node.toml"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def doctor_json(state_dir: Path, *args: str, memlock: int | None = None) -> tuple[int, dict[str, dict]]:
    proc = run(state_dir, "doctor", "--json", *args, memlock=memlock)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    return proc.returncode, {c["id"]: c for c in doc["checks"]}


def write_config(state_dir: Path, arena: str, size: int) -> None:
    (state_dir / "node.toml").write_text(
        f'[arena]\npath = "{arena}"\nsize = "{size}B"\n\n'  # sizes name their unit (gpuwarden.ops.foundation.units)
        '[[engines]]\nname = "dp0"\ngpu = 0\nargv = ["/bin/sleep", "600"]\n\n'
        '[[engines]]\nname = "dp1"\ngpu = 1\nargv = ["/bin/sleep", "600"]\n')


@pytest.fixture
def node(state_dir: Path) -> Path:
    proc = run(state_dir, "sim", "init", "--gpus", "4", "--vram", "64GiB", "--hive")
    assert proc.returncode == 0, proc.stderr
    return state_dir / "sim" / "root" / "sys" / "class" / "drm"


def test_planted_faults_are_found_and_survive_a_bundle(node, state_dir, tmp_path):
    shm = os.statvfs("/dev/shm")
    shm_total = shm.f_blocks * shm.f_frsize
    arena = f"/dev/shm/gw-doctor-{uuid.uuid4().hex[:8]}.arena"  # never created: the checks only size it
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    small = max(1 << 20, min(1 << 30, shm.f_bavail * shm.f_frsize // 4, ram // 16))  # fits shm and KFD's limit
    write_config(state_dir, arena, small)
    _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    roomy = hard

    code, healthy = doctor_json(state_dir, "--only", f"{GPU_CHECKS},{ARENA_CHECKS}", memlock=roomy)
    for check in GPU_CHECKS.split(",") + ["arena-fs", "kfd-budget"]:
        assert healthy[check]["verdict"] == "pass", (check, healthy[check]["reason"])
    if roomy == resource.RLIM_INFINITY or roomy >= 2 * small:
        assert healthy["memlock"]["verdict"] == "pass", healthy["memlock"]["reason"]
    assert healthy["xgmi-hive"]["details"]["0x51510001"]["members"] == [0, 1, 2, 3]

    # plant: GPU 1 trained at x8 of x16, GPU 2 with another SOS firmware, GPU 3 with an uncorrectable UMC error,
    # an arena larger than /dev/shm, and engines launched under a 64 KiB memlock limit
    (node / "card1/device/current_link_width").write_text("8\n")
    (node / "card2/device/fw_version/sos_fw_version").write_text("0x0036024c\n")
    (node / "card3/device/ras/umc_err_count").write_text("ue: 1\nce: 4\nde: 0\n")
    write_config(state_dir, arena, shm_total + (1 << 30))
    code, faulty = doctor_json(state_dir, "--only", f"{GPU_CHECKS},{ARENA_CHECKS}", memlock=64 << 10)
    assert code == 1
    assert faulty["pcie-link"]["verdict"] == "fail" and "card1 x8 of x16" in faulty["pcie-link"]["reason"]
    assert faulty["pcie-link"]["fix"] and "/sys/class/drm/card*/device/current_link_width" in faulty["pcie-link"]["read"]
    assert faulty["firmware"]["verdict"] == "warn" and "sos_fw_version differs" in faulty["firmware"]["reason"]
    assert "GPU 2" in faulty["firmware"]["reason"]
    assert faulty["ras"]["verdict"] == "fail" and "GPU 3 umc ue=1" in faulty["ras"]["reason"]
    # a check that did not pass names the known issues about its subject (ops/knowledge, topic doctor:<id>)
    assert "mes-firmware-0x83-strix-halo" in [k["id"] for k in faulty["firmware"]["known"]]
    assert "mi50-athub-uncorrectable-ras" in [k["id"] for k in faulty["ras"]["known"]]
    assert "known" not in healthy["firmware"]
    assert faulty["arena-fs"]["verdict"] == "fail" and "/dev/shm" in faulty["arena-fs"]["reason"]
    assert faulty["memlock"]["verdict"] == "warn" and "64.0 KiB" in faulty["memlock"]["reason"]
    for check in ("xgmi-hive", "large-bar", "gpu-recovery"):
        assert faulty[check]["verdict"] == "pass"

    # the same node as an incident bundle captured it, read back by `doctor --bundle`
    out = run(state_dir, "bundle", "--safe-mode", "--output", f"{tmp_path}/", "--json", memlock=64 << 10)
    assert out.returncode == 0, out.stderr
    bundle = json.loads(out.stdout)["path"]
    proc = run(state_dir, "doctor", "--bundle", bundle, "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert doc["source"] == f"bundle:{bundle}" and doc["simulated"] is True
    replayed = {c["id"]: c for c in doc["checks"]}
    _, live = doctor_json(state_dir, memlock=64 << 10)
    differ = {k: (live[k]["verdict"], replayed[k]["verdict"]) for k in live
              if live[k]["verdict"] != replayed[k]["verdict"]}
    assert differ == {}, differ
    assert "the bundle's collector: 64.0 KiB" in replayed["memlock"]["reason"]


def test_text_report_lists_what_is_wrong_first_with_its_fix(node, state_dir):
    (node / "card0/device/current_link_width").write_text("4\n")
    proc = run(state_dir, "doctor", "--only", "pcie-link,ras,firmware")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("gpuwarden doctor: live (SIMULATED GPUs), 3 checks in")
    assert lines[2].startswith("FAIL  pcie-link")
    assert any(line.strip().startswith("fix: reseat the GPU") for line in lines)
    assert lines[-1] == "doctor: NEEDS ATTENTION (1 fail, 2 pass)"


def test_usage_errors_exit_2_with_one_line(node, state_dir, tmp_path):
    proc = run(state_dir, "doctor", "--only", "pcie-lnk", "--json")
    assert proc.returncode == 2
    assert "no doctor check named pcie-lnk" in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["schema"] == "gpuwarden.error/1"
    missing = run(state_dir, "doctor", "--bundle", str(tmp_path / "nope.tar.gz"))
    assert missing.returncode == 2 and "no bundle at" in missing.stderr
    listed = run(state_dir, "doctor", "--list")
    assert listed.returncode == 0 and "pcie-link" in listed.stdout and "nvidia-persistenced" in listed.stdout


def test_one_check_is_one_check(node, state_dir):
    # `doctor --only agent` said "1 checks" (issue 36).
    proc = run(state_dir, "doctor", "--only", "agent")
    assert ", 1 check in " in proc.stdout.splitlines()[0], proc.stdout
