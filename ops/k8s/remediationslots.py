"""At most N nodes of a cluster remediating at once: N coordination.k8s.io Leases, one per slot, each held by
one node's agent. Taking, renewing and freeing a slot are writes at the resourceVersion just read, so of two
agents racing for the last slot the API server lets exactly one win (the other gets 409 and looks elsewhere).

A holder that stopped renewing for leaseDurationSeconds (a crashed agent, a lost node) loses its slot to the
next agent that asks. The remediation loop (ops/services/k8s_remediation.py) takes one before it cordons a node.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable

from gpuwarden.ops.k8s.kube import Conflict, Kube, NotFoundError
from gpuwarden.ops.k8s.objects import Lease

PREFIX = "gpuwarden-remediation-"


def _stamp(t: float) -> str:
    # MicroTime: RFC 3339 with microseconds, as the API serves Lease times.
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.strptime(stamp.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except ValueError:
        try:
            return datetime.strptime(stamp.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except ValueError:
            return None


class ClusterSlots:
    """`slots` Leases named gpuwarden-remediation-<i> in `namespace`; `holder` is this node's name."""

    def __init__(self, kube: Kube, namespace: str, holder: str, *, slots: int = 1, duration_s: int = 600,
                 wall: Callable[[], float] = time.time):
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.kube, self.namespace, self.holder = kube, namespace, holder
        self.slots, self.duration_s, self.wall = slots, int(duration_s), wall
        self.held: str | None = None  # the name of the slot this agent holds

    def _mine(self, lease: Lease) -> bool:
        return (lease.get("spec") or {}).get("holderIdentity") == self.holder

    def _free(self, lease: Lease, now: float) -> bool:
        spec = lease.get("spec") or {}
        if not spec.get("holderIdentity"):
            return True
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = spec.get("leaseDurationSeconds") or self.duration_s
        return renewed is None or now > renewed + duration

    def acquire(self) -> str | None:
        """The slot now held (one already held is renewed), or None when all are taken by live holders."""
        if self.held is not None and self.renew():
            return self.held
        now = self.wall()
        for i in range(self.slots):
            name = f"{PREFIX}{i}"
            try:
                lease = self.kube.lease(self.namespace, name)
            except NotFoundError:
                try:
                    self.kube.create_lease(self.namespace, {
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
                        "spec": {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_s,
                                 "acquireTime": _stamp(now), "renewTime": _stamp(now), "leaseTransitions": 0}})
                except Conflict:
                    continue  # another agent created it first
                self.held = name
                return name
            if not (self._mine(lease) or self._free(lease, now)):
                continue
            spec = (lease.get("spec") or {}).copy()
            if not self._mine(lease):
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
                spec["acquireTime"] = _stamp(now)
            spec["holderIdentity"] = self.holder
            spec["leaseDurationSeconds"] = self.duration_s
            spec["renewTime"] = _stamp(now)
            try:
                self.kube.update_lease(self.namespace, {**lease, "spec": spec})
            except Conflict:
                continue  # someone took or renewed it since it was read
            self.held = name
            return name
        return None

    def renew(self) -> bool:
        """Keep the held slot; False (and nothing held) when another holder took it meanwhile."""
        if self.held is None:
            return False
        try:
            lease = self.kube.lease(self.namespace, self.held)
            if not self._mine(lease):
                self.held = None
                return False
            self.kube.update_lease(self.namespace, {**lease, "spec": {**lease["spec"],
                                                                      "renewTime": _stamp(self.wall())}})
            return True
        except (Conflict, NotFoundError):
            self.held = None
            return False

    def release(self) -> None:
        """Free the held slot for the next node (only if it is still ours)."""
        name, self.held = self.held, None
        if name is None:
            return
        for _ in range(3):
            try:
                lease = self.kube.lease(self.namespace, name)
                if not self._mine(lease):
                    return
                self.kube.update_lease(self.namespace, {**lease, "spec": {**lease["spec"], "holderIdentity": None,
                                                                          "renewTime": None}})
                return
            except Conflict:
                continue
            except NotFoundError:
                return
