"""The shared weight arena: file format, create/verify/inspect, mappers, budget preflight.

Registration runtimes live in gpuwarden.ops.register; the canary engine in gpuwarden.ops.canary.
"""
