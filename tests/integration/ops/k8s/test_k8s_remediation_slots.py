"""The cluster-wide remediation limit (ops/k8s/remediationslots): Leases on the API-server stand-in with
resourceVersion semantics; agents racing for a slot never both get it; a dead holder's slot expires."""

from __future__ import annotations

import threading

import pytest

from helpers.k8s import Clock, api  # noqa: F401  (the stand-in fixture)
from gpuwarden.ops.k8s.kube import Conflict
from gpuwarden.ops.k8s.remediationslots import ClusterSlots

NS = "gpuwarden"


def test_a_stale_resource_version_is_a_conflict(api):  # noqa: F811
    kube = api.kube()
    made = kube.create_lease(NS, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    kube.update_lease(NS, {**made, "spec": {"holderIdentity": "b"}})
    with pytest.raises(Conflict):
        kube.update_lease(NS, {**made, "spec": {"holderIdentity": "c"}})  # read before b's write
    with pytest.raises(Conflict):
        kube.create_lease(NS, {"metadata": {"name": "l"}, "spec": {}})
    assert kube.lease(NS, "l")["spec"]["holderIdentity"] == "b"


def test_one_slot_one_holder_until_it_is_released(api):  # noqa: F811
    a, b = ClusterSlots(api.kube(), NS, "node-a"), ClusterSlots(api.kube(), NS, "node-b")
    assert a.acquire() == "gpuwarden-remediation-0"
    assert b.acquire() is None
    assert a.acquire() == "gpuwarden-remediation-0" and a.renew()  # holding it again is renewing it
    a.release()
    assert b.acquire() == "gpuwarden-remediation-0" and not a.renew()
    assert api.leases[(NS, "gpuwarden-remediation-0")]["spec"]["leaseTransitions"] == 1


def test_a_holder_that_stops_renewing_loses_its_slot(api):  # noqa: F811
    clock = Clock(1_800_000_000.0)
    a = ClusterSlots(api.kube(), NS, "node-a", duration_s=60, wall=clock)
    b = ClusterSlots(api.kube(), NS, "node-b", duration_s=60, wall=clock)
    assert a.acquire()
    clock.advance(59)
    assert b.acquire() is None
    clock.advance(2)  # a's lease ran out: it crashed, or its node is gone
    assert b.acquire() == "gpuwarden-remediation-0"
    assert not a.renew() and a.held is None  # a learns it lost the slot, and must stop remediating


@pytest.mark.parametrize("slots", [1, 2])
def test_agents_racing_never_exceed_the_cluster_limit(api, slots):  # noqa: F811
    for round_ in range(5):
        agents = [ClusterSlots(api.kube(), NS, f"node-{round_}-{i}", slots=slots) for i in range(6)]
        start = threading.Barrier(len(agents))
        got: list[str | None] = [None] * len(agents)

        def race(i: int, start=start, got=got, agents=agents) -> None:
            start.wait()
            got[i] = agents[i].acquire()
        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(agents))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [g for g in got if g]
        assert len(winners) == slots and len(set(winners)) == slots, got
        holders = {api.leases[(NS, n)]["spec"]["holderIdentity"] for n in winners}
        assert holders == {agents[i].holder for i, g in enumerate(got) if g}
        for a in agents:
            a.release()
