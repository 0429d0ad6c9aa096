"""The fleet's playbooks: a node's own playbook run remotely over SSH, fleet status rows, fleet bundles.

The SSH mechanics are in gpuwarden.ops.fleet; the Typer commands in playbooks/cli/commands/fleet.py.
"""
