"""One module per CLI command group; each exposes register(app).

Commands stay thin: parse arguments, build a playbook or call ops, print.
"""
