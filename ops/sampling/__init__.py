"""Sampling one node: GPU/process attribution on every refresh, the node extras beside it, and the thread
that keeps sampling; status, the TUI, the agent and the exporter share it.
"""

from gpuwarden.ops.sampling.sampler import Sampler, take_snapshot

__all__ = ["Sampler", "take_snapshot"]
