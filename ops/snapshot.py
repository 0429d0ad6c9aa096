"""Where older code finds the Sampler: it lives in gpuwarden.ops.sampling now (attribution | node extras | thread).

Kept so that `from gpuwarden.ops.snapshot import Sampler, take_snapshot` and the tolerance constants keep working.
"""

from .sampling.attribution import (  # noqa: F401
    NOT_ACCOUNTED, NOT_LIVE, TOLERANCE_FRACTION, TOLERANCE_NO_BASELINE, TOLERANCE_WITH_BASELINE,
    in_nested_pid_namespace,
)
from .sampling.sampler import Sampler, take_snapshot  # noqa: F401
