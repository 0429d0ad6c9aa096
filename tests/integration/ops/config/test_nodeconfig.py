"""The node config (ops/config/nodeconfig): one-line errors naming file, line and key; `config check` lists each error
once; the README examples parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.ops.foundation.errors import ConfigError
from gpuwarden.ops.config.nodeconfig import parse
from gpuwarden.playbooks.cli.commands.config import FOUR_ENGINES, RUNTIMES, canary_example
from helpers.configs import BROKEN, GOOD

# The sim node the `config check` tests run on (conftest.py's sim_cli reads it): BROKEN names GPU 7 of four.
SIM_NODE = {"gpus": 4}



@pytest.mark.parametrize("broken, line, words", [
    (GOOD.replace("slots = 2", "slots = two"), 2, ["not valid TOML", "slots = two"]),
    (GOOD.replace("slots = 2", "slots = 0"), 2, ["stagger.slots", "at least 1"]),
    (GOOD.replace('gpu = 1', 'gpu = "one"'), 11, ["engines[1].gpu", "GPU index"]),
    (GOOD.replace('argv = ["/bin/true"]\n\n[[engines]]', 'argv = "/bin/true"\n\n[[engines]]'), 7,
     ["engines[0].argv", "list of strings"]),
    (GOOD.replace('name = "e1"', 'name = "e1"\nrestart = "always"'), 11, ["engines[1].restart", "on-failure"]),
    (GOOD.replace('name = "e1"', 'name = "e0"'), 10, ["e0", "used twice"]),
    (GOOD.replace('name = "e1"', 'name = "e1"\nprogress = "log"'), 11, ["registered_pattern"]),
    (GOOD.replace('name = "e1"', 'name = "e1"\nstop_signal = "SIGFOO"'), 11, ["stop_signal", "SIGFOO"]),
    (GOOD.replace('name = "e1"', 'name = "e1"\nregistered_pattern = "up ["'), 11, ["registered_pattern", "regular"]),
    (GOOD.replace('slots = 2', 'slots = 2\nslot = 3'), 3, ["stagger.slot", "unknown key"]),
    ("[defaults]\nprogress = \"tea\"\n" + GOOD.replace("[stagger]\nslots = 2\n", ""), 2, ["defaults.progress"]),
])
def test_bad_config_names_line_and_key(broken, line, words):
    with pytest.raises(ConfigError) as err:
        parse(broken, Path("/etc/gpuwarden/node.toml"))
    message = err.value.message
    assert message.startswith(f"/etc/gpuwarden/node.toml:{line}: "), message
    for w in words:
        assert w in message, message
    assert err.value.hint


def test_examples_parse():
    four = parse(FOUR_ENGINES, Path("four.toml"))
    assert [e.gpu for e in four.engines] == [0, 1, 2, 3]
    assert all(e.restart == "on-failure" and e.progress == "preload" and e.gate_release == "ready"
               for e in four.engines)
    assert four.arena.size == 64 << 30 and four.stagger.slots == 1
    for runtime in RUNTIMES:
        canary = parse(canary_example(runtime), Path("canary.toml"))
        assert all(e.progress == "status" and e.argv[-1] == runtime for e in canary.engines)


def test_cli_check_one_line_error(tmp_path, cli):
    cfg = tmp_path / "node.toml"
    cfg.write_text(GOOD.replace('gpu = 1', 'gpu = -1'))
    proc = cli("--config", str(cfg), "config", "check")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    first, hint = proc.stderr.strip().splitlines()
    assert first == f"gpuwarden: error: {cfg}:11: engines[1].gpu: must be a GPU index (0, 1, ...), got -1"
    assert hint.strip().startswith("hint:")
    cfg.write_text(GOOD)
    proc = cli("--config", str(cfg), "config", "check")
    assert proc.returncode == 0 and "ok" in proc.stdout
    proc = cli("--config", str(tmp_path / "missing.toml"), "config", "check")
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_config_check_lists_each_error_once_with_the_missing_gpu_and_takes_config_after_the_command(sim_cli, tmp_path):
    config = tmp_path / "node.toml"
    config.write_text(BROKEN)
    for args in (("--config", str(config), "config", "check"), ("config", "check", "--config", str(config))):
        proc = sim_cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("gpuwarden: error: ")]
        assert len(lines) == len(set(lines)) == 3, proc.stderr  # stop_grace once, though two engines inherit it
        text = "\n".join(lines)
        assert "node.toml:2: arena.path: must be an absolute path, got 'relative.arena'" in text
        assert "node.toml:5: defaults.stop_grace" in text
        assert "node.toml:9: engines[0].gpu: GPU 7 does not exist on this node (it has GPUs 0-3)" in text
