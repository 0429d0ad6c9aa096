"""The long-running services: the agent's daemon and HTTP API, the metrics server, the shim
that supervises one engine, the Kubernetes remediator. Each composes the domains below.
"""
