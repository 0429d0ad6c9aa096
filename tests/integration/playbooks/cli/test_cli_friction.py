"""The CLI's rough edges a new user hit (issue 24): a mistyped --state-dir, a GPU the node lacks, config check's
errors, a leak bigger than the GPU, plain words for a bad number. The real CLI in child processes, on the sim node.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.cli import gpuwarden
from helpers.configs import BROKEN

pytestmark = pytest.mark.timeout(120)


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("gpuwarden: error: ")]


# The sim node these tests run on (conftest.py's sim_cli fixture reads it): `sim init`'s own defaults.
SIM_NODE = {"gpus": 4, "vram": "24GiB"}


def test_a_missing_state_dir_parent_is_refused_not_created(tmp_path):
    where = tmp_path / "nonexistent" / "dir"
    proc = gpuwarden("--state-dir", str(where), "--backend", "sim", "status")
    assert proc.returncode == 2
    [line] = errors(proc)
    assert f"{tmp_path / 'nonexistent'} does not exist" in line
    assert "mkdir -p" in proc.stderr
    assert not (tmp_path / "nonexistent").exists()
    # The state dir itself (its parent there) is still made, as before.
    assert gpuwarden("--state-dir", str(tmp_path / "fresh"), "--backend", "sim", "status").returncode == 0
    assert (tmp_path / "fresh").is_dir()


def test_history_of_a_gpu_the_node_lacks(sim_cli):
    proc = sim_cli("history", "9")
    assert proc.returncode != 0
    [line] = errors(proc)
    assert "no GPU 9 on this node (GPUs: 0, 1, 2, 3)" in line


@pytest.mark.parametrize("bad, said", [("abc", "'abc' is not a GPU index"), ("1.5", "'1.5' is not a GPU index")])
def test_a_bad_gpu_index_is_said_in_plain_words(sim_cli, bad, said):
    proc = sim_cli("fix", bad)
    assert proc.returncode == 2
    [line] = errors(proc)
    assert said in line and "Input should be" not in proc.stderr and "pydantic" not in proc.stderr


def test_a_bad_number_option_is_said_in_plain_words(sim_cli):
    [line] = errors(sim_cli("fix", "1", "--grace", "soon"))
    assert "'--grace': 'soon' is not a number" in line


def test_sim_leak_cannot_exceed_the_gpu_and_hold_says_units(sim_cli):
    proc = sim_cli("sim", "leak", "--gpu", "1", "--size", "100GiB")
    assert proc.returncode == 2
    [line] = errors(proc)
    assert "has 24.0 GiB free of 24.0 GiB: it cannot leak 100.0 GiB" in line
    assert json.loads(sim_cli("sim", "show", "--json").stdout)["leaked"] == {}
    ok = sim_cli("sim", "leak", "--gpu", "1", "--size", "14GiB")
    assert ok.returncode == 0 and "14.0 GiB leaked" in ok.stdout
    [line] = errors(sim_cli("sim", "leak", "--gpu", "1", "--size", "11GiB"))
    assert "has 10.0 GiB free" in line


def test_sim_hold_says_sizes_in_units_and_refuses_nothing(sim_cli):
    # It answered "asked 107374182400 bytes, 25769803776 free" and held 0GiB as a tenant (issue 36).
    [line] = errors(sim_cli("sim", "hold", "--gpu", "0", "--size", "100GiB"))
    assert "out of memory on simulated GPU 0: asked 100.0 GiB, 24.0 GiB free of 24.0 GiB" in line
    zero = sim_cli("sim", "hold", "--gpu", "0", "--size", "0GiB", timeout=20)
    assert zero.returncode == 2 and "a simulated tenant must hold more than 0 bytes" in errors(zero)[0]




def test_status_through_the_agent_warns_about_a_broken_config_given_to_it(sim_cli, tmp_path, state_dir):
    from helpers.agentnode import start_agent
    config = tmp_path / "node.toml"
    config.write_text(BROKEN)
    agent = start_agent(state_dir)
    try:
        from helpers.simnode import wait_for
        # READY comes before the first snapshot: until it exists status samples the node itself
        wait_for(lambda: agent.json("/healthz")["ok"], timeout=30, what="the agent's first snapshot")
        proc = sim_cli("--config", str(config), "status")
        assert "via agent" in proc.stdout, proc.stdout
        assert "node config unusable" in proc.stdout and "must be an absolute path" in proc.stdout, proc.stdout
        doc = json.loads(sim_cli("--config", str(config), "status", "--json").stdout)
        assert any(w["code"] == "config-unusable" for w in doc["warnings"])
        plain = sim_cli("status")
        assert "node config unusable" not in plain.stdout  # no --config given: the agent's own config stands
    finally:
        agent.stop()


def test_sim_hold_says_what_it_holds_in_units(sim_cli, state_dir):
    import os
    import sys
    from helpers.paths import REPO
    from helpers.simnode import cli_argv
    proc = subprocess.Popen(cli_argv(state_dir, "sim", "hold", "--gpu", "0", "--size", "1536MiB"), cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    assert line.startswith("holding 1.5 GiB on GPU 0 as pid "), (line, sys.executable)


def _entries(state: Path, *when: float) -> None:
    """Journal lines at the given times, written as the journal writes them (then re-dated in place)."""
    from gpuwarden.ops.foundation import journal
    for i, _ts in enumerate(when):
        journal.write(state, f"drill-{i}", "ok")
    path = state / "journal.log"
    lines = path.read_text().splitlines()
    out = []
    for line, ts in zip(lines[-len(when):], when):
        e = json.loads(line)
        e["ts"] = ts
        out.append(json.dumps(e))
    path.write_text("\n".join(lines[:-len(when)] + out) + "\n")


def test_journal_since_and_until_pick_a_window(sim_cli, state_dir):
    import time
    now = time.time()
    _entries(state_dir, now - 7200, now - 1800, now - 60)
    actions = lambda proc: [json.loads(x)["action"] for x in proc.stdout.splitlines()]  # noqa: E731
    assert actions(sim_cli("journal", "--since", "1h", "--json")) == ["drill-1", "drill-2"]
    assert actions(sim_cli("journal", "--until", "45m", "--json")) == ["drill-0"]
    assert actions(sim_cli("journal", "--since", "3h", "--until", "10m", "--json")) == ["drill-0", "drill-1"]
    local = time.strftime("%Y-%m-%d %H:%M", time.localtime(now - 2400))
    assert actions(sim_cli("journal", "--since", local, "--json")) == ["drill-1", "drill-2"]
    [line] = errors(sim_cli("journal", "--since", "last tuesday"))
    assert "cannot read the time 'last tuesday'" in line
    [line] = errors(sim_cli("journal", "--since", "10m", "--until", "1h"))
    assert "is before --since" in line


def test_journal_follow_prints_new_entries_as_they_are_written(sim_cli, state_dir):
    import os
    import select
    import signal
    from helpers.paths import REPO
    from helpers.simnode import cli_argv, wait_for
    from gpuwarden.ops.foundation import journal
    journal.write(state_dir, "before", "ok")
    from helpers.signals import default_signals
    proc = subprocess.Popen(cli_argv(state_dir, "journal", "-f", "--json"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ), preexec_fn=default_signals)
    got: list[str] = []

    def read_some() -> bool:
        if select.select([proc.stdout], [], [], 0.05)[0]:
            got.append(os.read(proc.stdout.fileno(), 65536).decode())
        return "".join(got)

    try:
        wait_for(lambda: '"before"' in read_some(), 20, "the existing entry")
        journal.write(state_dir, "after", "ok")
        wait_for(lambda: '"after"' in read_some(), 20, "the new entry to be followed")
        # Rotated away and started again: the follower reads the new file from its start.
        (state_dir / "journal.log").rename(state_dir / "journal.log.1")
        journal.write(state_dir, "rotated", "ok")
        wait_for(lambda: '"rotated"' in read_some(), 20, "the entry in the new file")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0


def test_a_global_option_after_the_command_says_where_it_goes(sim_cli):
    proc = sim_cli("launch", "--config", "/etc/gpuwarden/node.toml")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[1] == ("  hint: --config is a global option: give it before the command "
                                          "(gpuwarden --config PATH launch ...)"), proc.stderr


@pytest.mark.parametrize("group", ["engines", "arena", "sim", "config", "baseline", "fleet"])
def test_a_bare_group_prints_its_help(sim_cli, group):
    # It printed its usage on one line with literal \n and exited 2 (issue 36).
    proc = sim_cli(group)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"Usage: gpuwarden {group} [OPTIONS] COMMAND") and "\\n" not in proc.stdout
    assert "Commands:" in proc.stdout.splitlines() and proc.stderr == ""
