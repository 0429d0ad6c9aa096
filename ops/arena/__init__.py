"""The shared weight arena: file format, create/verify/inspect, mappers, budget preflight.

Registration runtimes live in ops.register; the canary engine in ops.canary.
"""
