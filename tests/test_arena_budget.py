"""`arena budget`: KFD's limit from a /proc and /sys tree, the N x G charge, the verdict's exit code and advice.

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


def test_four_engines_seeing_four_gpus_do_not_fit(cli, tmp_path):
    proc, sys_root = node(tmp_path, 512 * GiB, "0")
    out = run(cli, proc, sys_root, "--size", "64GiB", "--engines", "4", "--visible-gpus", "4", "--json")
    assert out.returncode == 1, out.stderr
    b = json.loads(out.stdout)
    assert b["charged"] == 64 * GiB * 16 and b["limit"] == kfd_system_limit(512 * GiB) and b["fits"] is False
    assert b["charged_own_gpu"] == 256 * GiB
    assert any("ROCR_VISIBLE_DEVICES" in a and "which fits" in a for a in b["advice"])
    assert any("no_system_mem_limit=1" in a for a in b["advice"])
    text = run(cli, proc, sys_root, "--size", "64GiB", "--engines", "4", "--visible-gpus", "4")
    assert "DOES NOT FIT" in text.stdout and "1.0 TiB" in text.stdout


def test_own_gpu_fits_and_parameter_lifts_the_limit(cli, tmp_path):
    proc, sys_root = node(tmp_path, 512 * GiB, "0")
    ok = run(cli, proc, sys_root, "--size", "64GiB", "--engines", "4", "--visible-gpus", "1")
    assert ok.returncode == 0 and "verdict: fits" in ok.stdout
    lifted_root = tmp_path / "lifted"
    lifted_root.mkdir()
    proc2, sys2 = node(lifted_root, 512 * GiB, "1")
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
    config.write_text(f'[arena]\npath = "/dev/shm/x.arena"\nsize = "60GiB"\n{engines}')
    out = cli("--config", str(config), "--proc-root", str(proc), "--sysfs-root", str(sys_root),
              "arena", "budget", "--json")
    assert out.returncode == 0, out.stderr
    b = json.loads(out.stdout)
    assert b["engines"] == 4 and b["visible_gpus"] == [1, 1, 1, 1] and b["charged"] == 240 * GiB


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
    assert b["visible_gpus"] == [4, 1] and b["charged"] == 32 * GiB * 5
