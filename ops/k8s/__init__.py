"""Kubernetes mode: pod attribution, the node condition/taint, AMD device-plugin health, evictions.

Only `gpuwarden agent --kubernetes`, `drain --kubernetes`, `gpu-check` and `post-clean` import the
official `kubernetes` client (lazily); the cgroup parser and the reconciler's logic need no library.
"""
