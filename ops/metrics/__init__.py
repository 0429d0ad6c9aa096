"""Prometheus exposition of the node: a collector rebuilt from the latest snapshot at each scrape, the agent's
exporter (HTTP(S) listener, counters fed by its events), the one-shot form and node_exporter textfiles.
"""
