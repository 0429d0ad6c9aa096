"""The registration gate with real processes: a SIGKILLed holder frees its slot; K slots admit K."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from helpers.paths import REPO
from gpuwarden.ops.foundation import gate

HOLDER = """
import sys, time
from pathlib import Path
from gpuwarden.ops.foundation import gate
slot = gate.acquire(Path(sys.argv[1]), int(sys.argv[2]), who="holder")
print(slot.index, flush=True)
time.sleep(60)
"""


def _holder(gate_dir, slots):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(gate_dir), str(slots)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip().isdigit()
    return proc


def test_sigkilled_holder_frees_its_slot(tmp_path):
    gate_dir = tmp_path / "gate"
    holder = _holder(gate_dir, 1)
    try:
        assert [h["pid"] for h in gate.holders(gate_dir, 1)] == [holder.pid]
        with pytest.raises(gate.GateTimeout):
            gate.acquire(gate_dir, 1, timeout_s=0.2)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(5)
        # The kernel dropped the dead holder's flock: the slot is free at once, nothing to clean.
        slot = gate.acquire(gate_dir, 1, who="next", timeout_s=2)
        assert slot.index == 0
        assert [h["who"] for h in gate.holders(gate_dir, 1)] == ["next"]
        slot.release()
        assert gate.holders(gate_dir, 1) == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_k_slots_admit_exactly_k(tmp_path):
    gate_dir = tmp_path / "gate"
    holders = [_holder(gate_dir, 2) for _ in range(2)]
    try:
        assert len(gate.holders(gate_dir, 2)) == 2
        with pytest.raises(gate.GateTimeout):
            gate.acquire(gate_dir, 2, timeout_s=0.2)
    finally:
        for h in holders:
            h.kill()
            h.wait()
