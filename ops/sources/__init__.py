"""Where a snapshot comes from: the node agent, a Sampler here, an incident bundle, or the simulated node.

choose.py decides (the one place that does); kinds.py holds the sources it hands back.
"""
