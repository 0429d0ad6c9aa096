"""Special files where gpuwarden expects a regular one: a FIFO (would hang any plain open) and /dev/zero
(never ends) as node config, arena, bundle and --from source get one line and exit 2, promptly.

Real FIFOs and devices; a hang shows up as the subprocess timeout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.cli import gpuwarden


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def one_line(proc, needle: str, code: int = 2) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[0].startswith("gpuwarden: error: ") and needle in lines[0], proc.stderr
    assert len(lines) <= 2 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, needle", [
    (("--config", "{}", "config", "check"), "node config {} is a"),
    (("--config", "{}", "arena", "budget"), "node config {} is a"),
    (("--config", "{}", "launch", "--dry-run"), "node config {} is a"),
    (("arena", "verify", "{}"), "arena {} is a"),
    (("status", "--bundle", "{}"), "bundle {} is a"),
    (("arena", "create", "{}.arena", "--from", "{}"), "source file {} is a"),
])
def test_a_fifo_is_one_line_not_a_hang(state_dir, fifo, args, needle):
    path = str(fifo)
    t0 = time.monotonic()
    proc = gpuwarden("--state-dir", str(state_dir), *(a.replace("{}", path) for a in args), timeout=30)
    one_line(proc, needle.replace("{}", path))
    assert time.monotonic() - t0 < 25


def test_status_with_a_fifo_config_still_shows_the_node(state_dir, fifo):
    proc = gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "--config", str(fifo), "status", timeout=30)
    assert proc.returncode == 0 and "node config unusable" in proc.stdout and "FIFO" in proc.stdout, proc.stdout


def test_a_fifo_arena_in_the_config_is_shown_unreadable(state_dir, fifo, tmp_path):
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'[arena]\npath = "{fifo}"\n')
    proc = gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "--config", str(cfg), "status", timeout=30)
    assert proc.returncode == 0 and f"arena {fifo}" in proc.stdout and "unreadable" in proc.stdout, proc.stdout
    proc = gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "--config", str(cfg), "purge", "--arenas",
                     "--dry-run", timeout=30)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    proc = gpuwarden("--state-dir", str(state_dir), "arena", "inspect", str(fifo), timeout=30)
    assert proc.returncode == 2 and "FIFO" in proc.stdout + proc.stderr


def test_an_oversized_config_is_refused_unread(state_dir, tmp_path):
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: costs no disk
    proc = gpuwarden("--state-dir", str(state_dir), "--config", str(big), "config", "check", timeout=30)
    one_line(proc, "larger than a node config can be")


def test_dev_zero_is_refused_before_a_byte_is_read(tmp_path):
    from gpuwarden.ops.foundation import inputs
    from gpuwarden.ops.config import nodeconfig
    from gpuwarden.ops.arena import format as fmt
    from gpuwarden.ops.bundle import replay
    from gpuwarden.ops.foundation.errors import GpuwardenError
    from gpuwarden.ops.foundation.settings import Settings
    for call, needle in (
        (lambda: nodeconfig.load(Settings(state_dir=tmp_path, config_path=Path("/dev/zero"))), "character device"),
        (lambda: fmt.load_header("/dev/zero"), "character device"),
        (lambda: replay.open_bundle("/dev/zero"), "character device"),
        (lambda: inputs.read_regular("/dev/urandom", "node config", 1 << 20), "character device"),
        (lambda: inputs.read_regular("/proc/self", "node config", 1 << 20), "directory"),
    ):
        with pytest.raises(GpuwardenError) as err:
            call()
        assert needle in err.value.message


def test_an_empty_metrics_listen_is_refused_not_ignored(state_dir):
    """`--metrics-listen ''` (a blank GPUWARDEN_METRICS_LISTEN) ran an agent without a listener, silently."""
    started = time.monotonic()
    proc = gpuwarden("--state-dir", str(state_dir), "--backend", "sim", "agent", "--foreground",
                     "--metrics-listen", "", timeout=30)
    one_line(proc, "--metrics-listen '' is not HOST:PORT")
    assert time.monotonic() - started < 30
