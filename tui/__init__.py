"""The Textual console: live views of a NodeSnapshot and keys that start playbooks.

Imports playbooks and ops, never the other way round.
"""
