"""The arena incident's own figures, replayed through `arena budget` on a 125 GiB node (issue 33).

The operator's facts: 2 x 56 GiB with 4 GPUs visible served for hours; 4 x 64 GiB crashed; 4 x 25 GiB crashed
too although its registrations fit. The verdicts must agree with each, and say what decides the last.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuwarden.ops.arena.budget import GiB, kfd_system_limit

NODE_RAM = 125 * GiB


def node(tmp_path: Path, pinned: str | None = None) -> list[str]:
    proc = tmp_path / "proc"
    proc.mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal:       {NODE_RAM // 1024} kB\nMemFree:        1000 kB\n")
    params = tmp_path / "sys" / "module" / "amdgpu" / "parameters"
    params.mkdir(parents=True)
    (params / "no_system_mem_limit").write_text("N\n")
    args = ["--proc-root", str(proc), "--sysfs-root", str(tmp_path / "sys")]
    if pinned is not None:
        config = tmp_path / "node.toml"
        config.write_text("".join(f'[[engines]]\nname = "dp{i}"\nargv = ["true"]\ngpu = {i}\n'
                                  f'pinned_headroom = "{pinned}"\n\n' for i in range(4)))
        args = ["--config", str(config), *args]
    return args


def budget(cli, args: list[str], *flags: str):
    out = cli(*args, "arena", "budget", *flags)
    return out, (json.loads(out.stdout) if "--json" in flags else None)


def test_the_limit_on_the_incident_node_is_121_55_gib():
    # 125 GiB - 125/64 GiB - 1.5 GiB = 121.546875 GiB (amdgpu_amdkfd_gpuvm_init_mem_limits): "about 121.5".
    assert kfd_system_limit(NODE_RAM) == int(121.546875 * GiB)


def test_two_engines_of_56_gib_seeing_four_gpus_fit(cli, tmp_path):
    # What served for hours: 112 GiB charged once per process, not 2 x 4 x 56 = 448 GiB.
    out, b = budget(cli, node(tmp_path), "--size", "56GiB", "--engines", "2", "--visible-gpus", "4", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert b["charged"] == 112 * GiB and b["registrations_fit"] and b["fits"]
    text, _ = budget(cli, node(tmp_path / "t"), "--size", "56GiB", "--engines", "2", "--visible-gpus", "4")
    assert "DOES NOT FIT" not in text.stdout and "448" not in text.stdout


def test_four_engines_of_64_gib_do_not_fit(cli, tmp_path):
    out, b = budget(cli, node(tmp_path), "--size", "64GiB", "--engines", "4", "--visible-gpus", "1", "--json")
    assert out.returncode == 1
    assert b["charged"] == 256 * GiB and b["verdict"] == "does-not-fit" and not b["registrations_fit"]
    assert "engine 1's 64.0 GiB registration" in b["crossing"]  # the second one crosses 121.55 GiB


def test_four_engines_of_25_gib_fit_by_registrations_and_the_verdict_names_what_decides(cli, tmp_path):
    out, b = budget(cli, node(tmp_path), "--size", "25GiB", "--engines", "4", "--visible-gpus", "4", "--json")
    assert out.returncode == 0
    assert b["charged"] == 100 * GiB and b["registrations_fit"]
    assert b["verdict"] == "decided-by-pinned"  # the headroom is the default, not measured: no certainty
    assert b["left_after_registrations"] == int(21.546875 * GiB)
    assert "the 21.55 GiB left must hold every engine's pinned allocations" in b["decides"]
    assert "ledger" in b["decides"] and "kfd/mem_limit" in b["decides"]  # what confirms it on this node
    text, _ = budget(cli, node(tmp_path / "t"), "--size", "25GiB", "--engines", "4")
    assert "NOT CERTAIN" in text.stdout and "what decides it:" in text.stdout


def test_measured_pinned_headroom_turns_the_25_gib_case_into_the_incident(cli, tmp_path):
    # 6 GiB pinned per engine: 100 + 24 > 121.55. Every registration fits, the pinned allocations do not.
    out, b = budget(cli, node(tmp_path, pinned="6GiB"), "--size", "25GiB", "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    assert b["verdict"] == "pinned-does-not-fit" and b["registrations_fit"] and b["pinned_sources"] == ["config"] * 4
    assert "every registration fits" in b["crossing"] and "dp" in b["crossing"]
    small, b2 = budget(cli, node(tmp_path / "s", pinned="2GiB"), "--size", "25GiB", "--json")
    assert small.returncode == 0 and b2["verdict"] == "fits"  # measured and within: certain


def test_the_ledger_of_an_engines_last_run_beats_the_config_and_the_default(tmp_path, state_dir):
    from gpuwarden.ops.arena.budget import DEFAULT_PINNED_HEADROOM, pinned_headroom_for
    from gpuwarden.ops.engines import state as engine_state
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    engine = EngineConfig(name="dp0", argv=("true",), pinned_headroom=6 * GiB)
    assert pinned_headroom_for(engine, state_dir).source == "config"
    assert pinned_headroom_for("dp9", state_dir) == type(pinned_headroom_for("dp9", state_dir))(
        DEFAULT_PINNED_HEADROOM, "default")
    path = engine_state.engine_dir(state_dir, "dp0")
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"name": "dp0", "phase": "exited", "pinned_bytes": 9 * GiB}))
    measured = pinned_headroom_for(engine, state_dir)
    assert measured.bytes == 9 * GiB and measured.source == "ledger", measured
    # What the shim writes (ops/services/shim.py): the interposer's ledger under host_ledger; its peak wins.
    (path / "state.json").write_text(json.dumps({"name": "dp0", "phase": "exited", "host_ledger": {
        "pinned_bytes": 1 * GiB, "peak_bytes": 7 * GiB, "failed": 0, "failures": [], "processes": {}}}))
    measured = pinned_headroom_for(engine, state_dir)
    assert measured.bytes == 7 * GiB and measured.source == "ledger", measured
