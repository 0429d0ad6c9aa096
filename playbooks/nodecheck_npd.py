"""`gpuwarden gpu-check --node`: the node's GPUResidualVRAM verdict as node-problem-detector's custom plugin
protocol wants it (exit 0 OK, 1 problem, 2 unknown; one line of stdout that NPD puts in the condition).

The verdict and message are the agent's own (ops.k8s.nodesignal), so the two writers never disagree.
"""

from __future__ import annotations

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.k8s.nodesignal import assess, condition_for
from gpuwarden.ops.sampling.sampler import take_snapshot
from gpuwarden.ops.sources.choose import ONCE, choose

# NPD cuts a plugin's stdout at pluginConfig.max_output_length, 80 bytes by default
# (pkg/custompluginmonitor/types/config.go, defaultMaxOutputLength); deploy/k8s/npd sets the same.
MAX_OUTPUT = 80
OK, PROBLEM, UNKNOWN = 0, 1, 2


def fit(line: str, limit: int = MAX_OUTPUT) -> str:
    """One line of at most `limit` bytes (UTF-8), cut on a character boundary with '...' when too long."""
    line = " ".join(line.split())
    raw = line.encode()
    if len(raw) <= limit:
        return line
    return raw[:limit - 3].decode(errors="ignore") + "..."


def node_check(settings: Settings, use_agent: bool = True) -> tuple[int, str]:
    try:
        if use_agent:
            source = choose(settings, ONCE)  # the agent's latest when it answers, else sampled here
            try:
                snap = source.snapshot(deep=True)
            finally:
                source.close()
        else:
            snap = take_snapshot(settings)
        if not snap.gpus:
            return UNKNOWN, fit("no GPU found on this node: nothing to judge")
        status, _reason, message = condition_for(assess(snap), len(snap.gpus))
    except GpuwardenError as exc:
        return UNKNOWN, fit(f"cannot tell: {exc.message}")
    return (PROBLEM if status == "True" else OK), fit(message)
