"""The fleet: many nodes reached over SSH with the operator's own config, keys and host lists.

inventory/ansible read host lists; ssh connects (known_hosts policy); fanout and monitor run commands.
"""
