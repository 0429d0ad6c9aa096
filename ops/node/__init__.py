"""Node reading: the GPU backends, the simulated driver, /proc and KFD process attribution, debugfs,
topology. What the domains compose into a snapshot.
"""
