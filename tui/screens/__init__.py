"""Screens above the main view: confirm dialog, playbook progress, help, GPU detail, engine log, triage.

Each one closes with Escape and leaves the main view as it was.
"""
