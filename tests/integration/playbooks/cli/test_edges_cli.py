"""Rough edges a new user hit on the command line (issue 36): one format for report's seconds, history's empty
bar, the arena's memory warning and mode."""

from __future__ import annotations

import re


def _report(registrations: list[dict]) -> dict:
    return {"title": "t", "bundle": "b.tar.gz", "environment": {}, "what_happened": {"registrations": registrations},
            "reproduction": {"why": "w"}, "ruled_out": [], "known_issues": [], "attachments_total": 0,
            "attachments_bytes": 0, "attachments": []}


def test_report_seconds_column_has_one_format():
    from gpuwarden.ops.bugreport.render import markdown
    regs = [{"engine": "dp0", "call": "hipHostRegister", "bytes": 1 << 30, "outcome": "registered", "result": 0,
             "seconds": 0.1234},
            {"engine": "dp1", "call": "hipHostRegister", "bytes": 1 << 30, "outcome": "failed", "result": 1,
             "seconds": 0.1 + 0.2},
            {"engine": "dp2", "call": "hipHostRegister", "bytes": 1 << 30, "outcome": "running", "result": None,
             "seconds": None}]
    rows = [line for line in markdown(_report(regs)).splitlines() if line.startswith("| dp")]
    cells = [row.rstrip(" |").rsplit("| ", 1)[1] for row in rows]
    assert cells == ["0.123", "0.300", "not recorded"], cells
    assert all(re.fullmatch(r"\d+\.\d{3}|not recorded", c) for c in cells)


def test_history_never_draws_an_empty_bar():
    # Issue 36: `history` drew a series with nothing above zero as `||`.
    from gpuwarden.playbooks.cli.commands.history import _bar
    assert _bar("residual", [0, 0, 0], 1.0) == "  residual 0 B throughout (3 points)"
    assert _bar("used", [0, 0], 0) == "  used     0 B throughout (2 points)"
    assert _bar("used", [None, None], 0) == "  used     no readings (2 points)"
    drawn = _bar("used", [0, 5, 10], 10)
    assert drawn.startswith("  used     |") and drawn.endswith("|") and "||" not in drawn and drawn.count("█") == 1


def _fake_proc(root, mem_total_kb: int, mem_available_kb: int, tmpfs_dir) -> None:
    (root / "self").mkdir(parents=True)
    (root / "meminfo").write_text(f"MemTotal:       {mem_total_kb} kB\nMemFree:        1 kB\n"
                                  f"MemAvailable:   {mem_available_kb} kB\n")
    (root / "self" / "mountinfo").write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"30 22 0:25 / {str(tmpfs_dir).replace(' ', chr(92) + '040')} rw,nosuid,nodev shared:5 - tmpfs tmpfs rw\n")


def test_arena_create_on_tmpfs_warns_of_the_hosts_memory(cli, tmp_path):
    # Issue 36: a 14 GiB tmpfs arena on a 24 GiB host said nothing. Here: a fake /proc whose meminfo has 24 MiB
    # (so a 14 MiB arena is 58% of it) and whose mountinfo mounts the arena's directory as tmpfs.
    shm = tmp_path / "shm dir"
    shm.mkdir()
    proc = tmp_path / "proc"
    _fake_proc(proc, 24 * 1024, 20 * 1024, shm)
    made = cli("--proc-root", str(proc), "arena", "create", str(shm / "w.arena"), "--size", "14MiB",
               "--chunk-size", "1MiB", "-q")
    assert made.returncode == 0, made.stderr
    [warning] = [line for line in made.stderr.splitlines() if line.startswith("gpuwarden: warning: ")]
    assert "14.0 MiB arena on tmpfs" in warning and "58% of this host's 24.0 MiB" in warning, warning
    assert "20.0 MiB available now" in warning
    # Not on tmpfs (the root is ext4 in that mountinfo): nothing to say.
    other = tmp_path / "disk"
    other.mkdir()
    quiet = cli("--proc-root", str(proc), "arena", "create", str(other / "w.arena"), "--size", "14MiB",
                "--chunk-size", "1MiB", "-q")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr


def test_the_memory_warning_weighs_the_tmpfs_free_space():
    from gpuwarden.ops.arena.memcheck import warnings
    GiB = 1 << 30
    [said] = warnings(14 * GiB, 24 * GiB, 20 * GiB, "/dev/shm", 30 * GiB)  # a tmpfs mounted larger than RAM
    assert "58% of this host's 24.0 GiB, 20.0 GiB available now" in said and "the tmpfs has 30.0 GiB free" in said
    assert warnings(14 * GiB, 24 * GiB, 20 * GiB, "/dev/shm", 12 * GiB) == []  # create() refuses, naming the room
    assert warnings(2 * GiB, 24 * GiB, 20 * GiB, "/dev/shm", 12 * GiB) == []
    assert warnings(4 * GiB, 24 * GiB, 3 * GiB, "/dev/shm", 12 * GiB) != []  # more than is available now
    assert warnings(14 * GiB, 24 * GiB, 20 * GiB, None, None) == []


def test_an_arena_is_created_0640(cli, tmp_path):
    # Issue 36: arenas were created 0644, the weights readable by every local user.
    import os
    import stat
    old = os.umask(0o022)
    try:
        made = cli("arena", "create", str(tmp_path / "w.arena"), "--size", "4MiB", "--chunk-size", "1MiB", "-q")
    finally:
        os.umask(old)
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "w.arena").st_mode) == 0o640


def test_doctor_counts_one_check_in_the_singular(cli):
    # Issue 36: `doctor --only agent` said "1 checks".
    proc = cli("doctor", "--only", "agent")
    first = proc.stdout.splitlines()[0]
    assert ", 1 check in " in first, proc.stdout + proc.stderr
    many = cli("doctor").stdout.splitlines()[0]
    assert re.search(r", \d+ checks in ", many), many


def test_sizes_in_commands_to_paste_read_as_an_operator_types_them():
    # Issue 36: the arena's hint said `--size 268435456B`.
    from gpuwarden.ops.arena.format import recreate_hint
    from gpuwarden.ops.foundation.units import parse_size, size_arg
    assert "--size 256MiB`" in recreate_hint("/dev/shm/w.arena", 268435456)
    for n in (1, 4097, 1 << 10, 3 << 20, 14 << 30, (1 << 30) + (1 << 20), 5 << 40):
        assert parse_size(size_arg(n)) == n, n
    assert size_arg(268435456) == "256MiB" and size_arg(4097) == "4097B" and size_arg(14 << 30) == "14GiB"


def test_sim_hold_refuses_nothing_and_says_sizes_in_units(sim_cli):
    # Issue 36: `sim hold` accepted 0GiB and said its out-of-memory in raw bytes.
    zero = sim_cli("sim", "hold", "--gpu", "0", "--size", "0GiB", timeout=20)
    assert zero.returncode == 2 and "more than 0 bytes" in zero.stderr and "Traceback" not in zero.stderr
    big = sim_cli("sim", "hold", "--gpu", "0", "--size", "100GiB", timeout=20)
    assert big.returncode == 2, big.stderr
    first = big.stderr.splitlines()[0]
    assert "asked 100.0 GiB" in first and " GiB free" in first and "bytes" not in first, first


def test_agent_install_systemd_writes_the_unit_with_yes_and_nothing_without(cli, tmp_path):
    # Issue 36: `agent --install-systemd --yes` failed (TypeError in the write step) and wrote nothing.
    units = tmp_path / "units"
    units.mkdir()
    dry = cli("agent", "--install-systemd", "--unit-dir", str(units))
    assert dry.returncode == 0 and "dry run" in dry.stdout and not list(units.iterdir()), dry.stdout + dry.stderr
    done = cli("agent", "--install-systemd", "--yes", "--unit-dir", str(units))
    unit = units / "gpuwarden-agent.service"
    assert unit.exists(), done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "TypeError" not in done.stdout + done.stderr
    text = unit.read_text()
    assert "[Service]" in text and "ExecStart=" in text and " agent" in text
