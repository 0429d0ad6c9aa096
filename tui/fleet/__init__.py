"""The fleet console: a row per node, worst first; Enter opens that node's own console fed over SSH.

app.py is the App (the node console plus the fleet screen), screen.py the fleet list, remote_run.py the
playbook keys acting on the remote node.
"""
