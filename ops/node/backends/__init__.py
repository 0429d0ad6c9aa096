"""GPU backends: one protocol (base.Backend), several sources, chosen by select.open_backend.

amdsmi and sysfs for AMD, nvml for NVIDIA, sim for the simulated node.
"""
