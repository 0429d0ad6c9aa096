"""`arena budget`: KFD's limit from a /proc and /sys tree, the once-per-process charge, the verdict's exit code and advice.

The trees are real files under tmp_path, read through --proc-root/--sysfs-root as on a captured node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.ops.arena.budget import kfd_system_limit

GiB = 1 << 30


def node(tmp_path: Path, ram: int, no_limit: str | None) -> tuple[Path, Path]:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(f"MemTotal:       {ram // 1024} kB\nMemFree:        1000 kB\n")
    sys_root = tmp_path / "sys"
    if no_limit is not None:
        params = sys_root / "module" / "amdgpu" / "parameters"
        params.mkdir(parents=True)
        (params / "no_system_mem_limit").write_text(no_limit + "\n")
    else:
        sys_root.mkdir()
    return proc, sys_root


def test_limit_formula_follows_the_kernel():
    # mem - mem/64 - 1.5 GiB; halved instead when that would leave under 3 GiB.
    assert kfd_system_limit(512 * GiB) == 512 * GiB - 8 * GiB - 3 * GiB // 2
    assert kfd_system_limit(2 * GiB) == (2 * GiB - 2 * GiB // 64) // 2


def run(cli, proc: Path, sys_root: Path, *args: str):
    return cli("--proc-root", str(proc), "--sysfs-root", str(sys_root), "arena", "budget", *args)


def test_visible_gpus_change_the_mappings_not_the_charge(cli, tmp_path):
    # KFD charges a registration once per process (amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu); kfd_mem_attach gives
    # the other GPUs attachments, not reservations. Four GPUs visible or one: the same 256 GiB.
    proc, sys_root = node(tmp_path, 512 * GiB, "0")
    four = json.loads(run(cli, proc, sys_root, "--size", "64GiB", "--engines", "4", "--visible-gpus", "4",
                          "--json").stdout)
    one = json.loads(run(cli, proc, sys_root, "--size", "64GiB", "--engines", "4", "--visible-gpus", "1",
                         "--json").stdout)
    assert four["charged"] == one["charged"] == 256 * GiB and four["limit"] == kfd_system_limit(512 * GiB)
    assert four["verdict"] == one["verdict"] == "fits" and four["fits"] is True  # 246.5 GiB left: roomy


def test_over_the_limit_advises_no_visibility_cure_and_the_parameter_lifts_it(cli, tmp_path):
    proc, sys_root = node(tmp_path, 125 * GiB, "0")
    out = run(cli, proc, sys_root, "--size", "64GiB", "--engines", "4", "--visible-gpus", "4", "--json")
    assert out.returncode == 1, out.stderr
    b = json.loads(out.stdout)
    assert b["verdict"] == "does-not-fit" and b["fits"] is False
    assert any("does not lower this charge" in a for a in b["advice"])
    assert any("no_system_mem_limit=1" in a for a in b["advice"])
    assert "hipErrorInvalidValue" in b["crossing"] and "out of memory" not in b["crossing"]
    lifted_root = tmp_path / "lifted"
    lifted_root.mkdir()
    proc2, sys2 = node(lifted_root, 125 * GiB, "1")
    lifted = run(cli, proc2, sys2, "--size", "64GiB", "--engines", "4", "--visible-gpus", "4", "--json")
    assert lifted.returncode == 0 and json.loads(lifted.stdout)["no_limit"] is True


def test_missing_amdgpu_is_said_and_bad_input_is_one_line(cli, tmp_path):
    proc, sys_root = node(tmp_path, 64 * GiB, None)
    out = run(cli, proc, sys_root, "--size", "8GiB", "--engines", "2", "--visible-gpus", "2")
    assert out.returncode == 0 and "amdgpu is not loaded" in out.stdout
    bad = run(cli, proc, sys_root, "--size", "8 parsecs", "--engines", "2", "--visible-gpus", "2")
    assert bad.returncode == 2 and bad.stderr.startswith("gpuwarden: error: cannot read size")


def test_budget_from_node_config(cli, tmp_path, state_dir):
    pytest.importorskip("gpuwarden.ops.config.nodeconfig")
    proc, sys_root = node(tmp_path, 256 * GiB, "0")
    config = tmp_path / "node.toml"
    engines = "".join(
        f'\n[[engines]]\nname = "e{i}"\nargv = ["true"]\ngpu = {i}\nenv = {{ ROCR_VISIBLE_DEVICES = "{i}" }}\n'
        for i in range(4))
    config.write_text(f'[arena]\npath = "/dev/shm/x.arena"\nsize = "56GiB"\n{engines}')
    out = cli("--config", str(config), "--proc-root", str(proc), "--sysfs-root", str(sys_root),
              "arena", "budget", "--json")
    assert out.returncode == 0, out.stderr
    b = json.loads(out.stdout)
    assert b["engines"] == 4 and b["visible_gpus"] == [1, 1, 1, 1] and b["charged"] == 224 * GiB


def test_no_flags_and_no_config_says_what_to_pass(cli, tmp_path):
    proc, sys_root = node(tmp_path, 64 * GiB, "0")
    out = cli("--config", str(tmp_path / "absent.toml"), "--proc-root", str(proc), "--sysfs-root", str(sys_root),
              "arena", "budget", "--size", "8GiB")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "no node config" in out.stderr and "--visible-gpus" in out.stderr


def test_config_engines_without_gpu_see_every_kfd_gpu(cli, tmp_path):
    pytest.importorskip("gpuwarden.ops.config.nodeconfig")
    proc, sys_root = node(tmp_path, 256 * GiB, "0")
    nodes = sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    for i, gpu_id in enumerate([0, 1234, 5678, 9012, 3456]):  # node 0 is the CPU
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "gpu_id").write_text(f"{gpu_id}\n")
    config = tmp_path / "node.toml"
    config.write_text('[[engines]]\nname = "a"\nargv = ["true"]\n\n[[engines]]\nname = "b"\nargv = ["true"]\ngpu = 1\n')
    out = cli("--config", str(config), "--proc-root", str(proc), "--sysfs-root", str(sys_root),
              "arena", "budget", "--size", "32GiB", "--json")
    assert out.returncode == 0, out.stderr
    b = json.loads(out.stdout)
    assert b["visible_gpus"] == [4, 1] and b["charged"] == 32 * GiB * 2
