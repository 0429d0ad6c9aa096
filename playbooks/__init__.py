"""Playbooks and the `gpuwarden` CLI: named plans of steps that emit events.

The CLI (Typer) and the TUI run the same playbook objects; only the event sink differs.
"""
