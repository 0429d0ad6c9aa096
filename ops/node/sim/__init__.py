"""The simulated node: a small driver that keeps an amdgpu/KFD-shaped tree up to date.

The sysfs backend reads that tree, so every test and demo runs the real parsing code.
"""
