"""Kubernetes mode: pod attribution, the node condition/taint, AMD device-plugin health, evictions.

Only `gpuwarden agent --kubernetes`, `k8s-agent` and `drain/undrain --kubernetes` import the API client,
lightkube (lazily, in kube.py); the cgroup parser and the reconciler's logic need no library.
"""
