"""Where the console's snapshots come from; the sampling itself lives in gpuwarden.ops.sampling (shared with the agent).

Kept as the TUI's one import point: SamplingThread and the live/bundle/agent sources.
"""

from gpuwarden.ops.sampling.sources import AgentOrLocal, bundle_source, live_source, viewer_source  # noqa: F401
from gpuwarden.ops.sampling.thread import MIN_REFRESH_S, SamplingThread, SnapshotSource  # noqa: F401
