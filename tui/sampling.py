"""Where the console's snapshots come from; the sampling itself lives in ops.sampling (shared with the agent).

Kept as the TUI's one import point: SamplingThread and the live/bundle/agent sources.
"""

from ops.sampling.sources import AgentOrLocal, bundle_source, live_source, viewer_source  # noqa: F401
from ops.sampling.thread import MIN_REFRESH_S, SamplingThread, SnapshotSource  # noqa: F401
