"""The fleet: many nodes reached over SSH with the operator's own config, keys and host lists, or read from Prometheus.

inventory/ansible read host lists; ssh connects (known_hosts policy); fanout and monitor run commands; promapi,
promfleet and promwatch read the agents' series from Prometheus and fall back to SSH per node.
"""
