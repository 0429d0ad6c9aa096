"""The command line: the Typer root, its lazily loaded commands, global options, text views.
It runs the playbooks one folder up; nothing below imports it.
"""
