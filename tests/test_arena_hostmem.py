"""`arena create` warns before writing an arena that would take most of the host's RAM on tmpfs (issue 36: 14 GiB
on a 24 GiB host said nothing). The CLI runs for real; the host's memory and mounts come from a captured /proc
(--proc-root), so a small arena stands for a large one."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import gpuwarden


def proc_tree(root: Path, total_kb: int, available_kb: int, fs: str, where: Path) -> Path:
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {total_kb} kB\nMemFree: 1 kB\nMemAvailable: {available_kb} kB\n")
    # the arena's directory mounted as `fs`; a path with a space, as the kernel escapes it
    (proc / "self/mounts").write_text(f"/dev/sda1 / ext4 rw 0 0\n{fs} {str(where).replace(' ', chr(92) + '040')} "
                                      f"{fs} rw,size=65536k 0 0\n")
    return proc


@pytest.mark.parametrize("fs,total_kb,available_kb,warned", [
    ("tmpfs", 8192, 7000, True),      # 6 MiB of 8 MiB: more than half
    ("tmpfs", 65536, 4096, True),     # 6 MiB of 64 MiB, but only 4 MiB available now
    ("tmpfs", 65536, 60000, False),   # a small share, and it is there
    ("ext4", 8192, 7000, False),      # on disk: the page cache, not RAM, holds it
])
def test_a_large_arena_on_tmpfs_is_warned_about_before_it_is_written(tmp_path, fs, total_kb, available_kb, warned):
    shm = tmp_path / "shm dir"
    shm.mkdir()
    proc = proc_tree(tmp_path, total_kb, available_kb, fs, shm)
    made = gpuwarden("--state-dir", str(tmp_path / "s"), "--proc-root", str(proc), "arena", "create",
                     str(shm / "w.arena"), "--size", "6MiB", "-q")
    assert made.returncode == 0, made.stderr
    assert (shm / "w.arena").is_file()
    lines = [line for line in made.stderr.splitlines() if line.startswith("gpuwarden: warning:")]
    if warned:
        assert len(lines) == 1 and f"{shm} is tmpfs, which keeps files in RAM: this arena takes 6.0 MiB" in lines[0]
        assert "gpuwarden arena budget" in lines[0]
    else:
        assert lines == []


def test_a_small_arena_on_this_hosts_dev_shm_says_nothing(tmp_path):
    target = Path("/dev/shm") / f"gw-test-{tmp_path.name}.arena"
    try:
        made = gpuwarden("--state-dir", str(tmp_path / "s"), "arena", "create", str(target), "--size", "4MiB", "-q")
        assert made.returncode == 0 and "warning" not in made.stderr, made.stderr
    finally:
        target.unlink(missing_ok=True)
