"""Engine supervision: node config engines, the detached shim, engine state, control.

State lives under <state dir>/engines/<name>/.
"""
