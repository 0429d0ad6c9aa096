"""Cleaning a GPU between tenants: the reaper (ending holders safely) and GPU resets.
Every signal and reset goes through here, checked right before it acts.
"""
