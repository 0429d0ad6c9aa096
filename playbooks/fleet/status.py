"""The fleet's rows for `fleet status`: from Prometheus where its series are fresh, else each node's own
`gpuwarden status --json` over SSH in parallel (through the node's agent when one runs there).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.fleet.fanout import HostResult, run_everywhere
from gpuwarden.ops.fleet.inventory import Host
from gpuwarden.ops.fleet.summary import NodeHistory, NodeRow, from_result
from gpuwarden.ops.fleet import promfleet
from gpuwarden.ops.fleet.promapi import PrometheusError

from gpuwarden.playbooks.fleet.target import FleetTarget


def collect(target: FleetTarget, on_row: Callable[[NodeRow], None] | None = None,
            history_s: float | None = None) -> tuple[list[NodeRow], dict[str, Any] | None]:
    """(a row per node in the inventory's order, the Prometheus block of the JSON document or None)."""
    hosts: list[Host] = list(target.hosts)
    from_prom: dict[str, NodeRow] = {}
    notes: dict[str, str] = {}
    hist: dict[str, NodeHistory] = {}
    prom = None
    if target.prometheus is not None:
        p = target.prometheus
        api = p.api()
        prom = {"url": api.url, "selector": p.selector or None, "max_age_s": p.max_age_s, "error": None}
        try:
            reading = promfleet.read_fleet(p, hosts or None, api)
            hosts, from_prom, notes = list(reading.hosts), reading.rows, reading.missing
            if history_s:
                hist = promfleet.history(p, reading, history_s, api)
        except PrometheusError as exc:
            prom["error"] = exc.message
            if not hosts:
                raise GpuwardenError(f"no nodes: {exc.message}", "name the nodes too (--hosts, --nodelist, "
                                     "fleet.hosts): they are then read over SSH") from None
            notes = {h.name: "Prometheus did not answer" for h in hosts}
    if on_row is not None:
        for row in from_prom.values():
            on_row(row)

    def done(result: HostResult) -> None:
        if on_row is not None:
            on_row(from_result(result))
    rest = [h for h in hosts if h.name not in from_prom]
    results = run_everywhere(rest, target.remote("status", "--json"), target.ssh, parallel=target.parallel,
                             timeout=target.timeout, on_result=done) if rest else []
    over_ssh = {r.host.name: replace(from_result(r), note=notes.get(r.host.name)) for r in results}
    rows = [from_prom.get(h.name) or over_ssh[h.name] for h in hosts]
    return [replace(r, history=hist[r.name]) if r.name in hist else r for r in rows], prom
