"""`sim init` refuses what it cannot make before it touches the state dir (issue 25 item 7): the old node stays
whole and readable; the bounds are stated (1 to 64 GPUs, 64 MiB to 16 TiB of VRAM each).

Real state dirs, the real CLI for the reported case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.node.sim.node import MAX_VRAM, SimNode

SIM_NODE = {"gpus": 2, "vram": "8GiB"}


def tree(state: Path) -> dict[str, bytes]:
    return {str(p.relative_to(state)): p.read_bytes() for p in sorted((state / "sim").rglob("*")) if p.is_file()}


def test_a_refused_size_leaves_the_old_node_readable(sim_state, sim_cli):
    before = tree(sim_state)
    proc = sim_cli("sim", "init", "--force", "--vram", "999999PiB")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "gpuwarden: error: simulated VRAM per GPU must be between 64.0 MiB and 16.0 TiB, not 999999.0 PiB"
    assert "was changed" in lines[1] and len(lines) == 2, proc.stderr
    assert tree(sim_state) == before
    status = sim_cli("--backend", "sim", "status", "--json")
    assert status.returncode in (0, 1), status.stderr
    assert [g["vram_total"] for g in json.loads(status.stdout)["gpus"]] == [8 << 30] * 2


@pytest.mark.parametrize("gpus, vram, needle", [
    (0, 8 << 30, "1 to 64 GPUs, not 0"), (65, 8 << 30, "1 to 64 GPUs, not 65"),
    (2, (64 << 20) - 4096, "between 64.0 MiB and 16.0 TiB"), (2, MAX_VRAM + 1, "between 64.0 MiB and 16.0 TiB"),
    (2, 2 ** 70, "between 64.0 MiB and 16.0 TiB"),
])
def test_every_bound_is_checked_before_anything_is_removed(tmp_path, gpus, vram, needle):
    node = SimNode(tmp_path)
    node.init(gpus=2, vram=8 << 30)
    before = tree(tmp_path)
    with pytest.raises(GpuwardenError, match=needle):
        node.init(gpus=gpus, vram=vram, force=True)
    assert tree(tmp_path) == before and node.config()["gpus"] == 2


def test_the_largest_node_allowed_is_made_and_read_back(tmp_path):
    node = SimNode(tmp_path)
    node.init(gpus=64, vram=MAX_VRAM)
    assert node.config()["vram"] == MAX_VRAM and node.config()["gpus"] == 64
