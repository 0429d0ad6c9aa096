"""The fleet as Prometheus sees it: a row per node from the series its agent exports (ops/metrics), and its history.

A node whose series are missing, too old or from a stale agent gets no row here but the reason, for the SSH fallback.
"""

from __future__ import annotations

import ipaddress
import json
import math
import time
from dataclasses import dataclass, field

from gpuwarden.ops.fleet.inventory import Host, parse_target
from gpuwarden.ops.fleet.promapi import PrometheusApi, Sample
from gpuwarden.ops.fleet.summary import NodeHistory, NodeRow

# The gpuwarden_* families a fleet row needs (names as ops/metrics/families.py exports them).
ROW_FAMILIES = ("gpu_drained", "gpu_residual_bytes", "gpu_residual_significant", "gpu_residual_holders",
                "agent_info", "agent_stale", "agent_snapshot_age_seconds")
DEFAULT_MAX_AGE_S = 60.0
HISTORY_POINTS = 24


@dataclass(frozen=True)
class PromSettings:
    url: str
    selector: str = ""  # extra label matchers for every series, e.g. job="gpuwarden"
    max_age_s: float = DEFAULT_MAX_AGE_S  # older data than this (scrape + the agent's own snapshot age): use SSH
    timeout_s: float = 5.0

    def api(self) -> PrometheusApi:
        return PrometheusApi(self.url, self.timeout_s)


@dataclass
class Exporter:
    """One scraped gpuwarden exporter, identified by its (job, instance), and what its series say."""

    job: str
    instance: str
    hostname: str | None = None
    ts: float | None = None  # when Prometheus last scraped it (the agent_info sample's own time)
    info: dict[str, str] = field(default_factory=dict)
    stale: bool = False
    snapshot_age_s: float = 0.0
    gpus: dict[int, dict[str, float]] = field(default_factory=dict)  # gpu -> family -> value
    holders: dict[int, float] = field(default_factory=dict)
    engines: dict[str, str] = field(default_factory=dict)  # engine -> current phase

    @property
    def key(self) -> tuple[str, str]:
        return self.job, self.instance

    def names(self) -> set[str]:
        """What the node may be called in an inventory: the instance, without its port, and the hostname label."""
        out = {self.instance, _without_port(self.instance)}
        if self.hostname:
            out.add(self.hostname)
        return {n for n in out if n}


@dataclass(frozen=True)
class PromReading:
    at: float  # Prometheus's evaluation time
    hosts: tuple[Host, ...]  # the nodes asked about (the inventory, or every node Prometheus knows)
    rows: dict[str, NodeRow]  # node -> its row, for nodes Prometheus vouches for
    missing: dict[str, str]  # node -> why it is read over SSH instead
    exporters: dict[str, Exporter]  # node -> its exporter, also for stale ones (their history still helps)


def _without_port(instance: str) -> str:
    try:
        return parse_target(instance).name
    except ValueError:
        return instance


def _short(name: str) -> str:
    """gpu01 for gpu01.cluster.example (an address stays whole)."""
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        return name.split(".", 1)[0]


def selector(settings: PromSettings, name: str = "", *extra: str) -> str:
    """`name{matchers}` with the operator's selector added to every series."""
    matchers = [m for m in (settings.selector.strip(), *extra) if m]
    return f"{name}{{{', '.join(matchers)}}}" if matchers else name


def _exporters(api: PrometheusApi,
               settings: PromSettings) -> tuple[float, dict[tuple[str, str], Exporter], list[Sample]]:
    """Every gpuwarden exporter Prometheus has current series of, plus the failing scrapes (`up == 0`)."""
    families = "|".join(ROW_FAMILIES)
    values = api.query(selector(settings, "", f'__name__=~"gpuwarden_({families})"'))
    at = values[0].ts if values else time.time()
    phases = api.query(selector(settings, "gpuwarden_engine_phase") + " == 1", at=at)
    stamps = api.query(f"timestamp({selector(settings, 'gpuwarden_agent_info')})", at=at)
    down = api.query(selector(settings, "up") + " == 0", at=at)
    found: dict[tuple[str, str], Exporter] = {}

    def exporter(labels: dict[str, str]) -> Exporter:
        key = (labels.get("job", ""), labels.get("instance", ""))
        e = found.get(key)
        if e is None:
            e = found[key] = Exporter(*key, hostname=labels.get("hostname"))
        return e

    for s in values:
        name = s.labels.get("__name__", "").removeprefix("gpuwarden_")
        e = exporter(s.labels)
        if name == "agent_info":
            e.info = {k: v for k, v in s.labels.items() if k in ("backend", "simulated", "mode")}
        elif name == "agent_stale":
            e.stale = s.value == 1
        elif name == "agent_snapshot_age_seconds":
            e.snapshot_age_s = s.value if math.isfinite(s.value) else 0.0
        elif "gpu" in s.labels and s.labels["gpu"].isdigit():
            gpu = int(s.labels["gpu"])
            if name == "gpu_residual_holders":
                e.holders[gpu] = e.holders.get(gpu, 0.0) + s.value
            else:
                e.gpus.setdefault(gpu, {})[name] = s.value
    for s in phases:
        if "engine" in s.labels:
            exporter(s.labels).engines[s.labels["engine"]] = s.labels.get("phase", "")
    for s in stamps:
        exporter(s.labels).ts = s.value
    return at, found, down


def _row(host: Host, e: Exporter) -> NodeRow:
    """The fleet row of one node from its exporter's series: the same fields `status --json` gives over SSH."""
    residual_gpus = sorted(g for g, fams in e.gpus.items()
                           if fams.get("gpu_residual_significant") == 1 or e.holders.get(g, 0) > 0)
    residual = sum(max(0, int(e.gpus[g].get("gpu_residual_bytes", 0))) for g in residual_gpus)
    phases = list(e.engines.values())
    crashed = phases.count("crashed")
    simulated = {"true": True, "false": False}.get(e.info.get("simulated", ""))
    return NodeRow(
        name=host.name, target=host.target, state="attention" if residual_gpus or crashed else "ok",
        hostname=e.hostname, gpus=len(e.gpus), residual_bytes=residual if residual_gpus else None,
        residual_gpus=tuple(residual_gpus), holders=int(sum(e.holders.get(g, 0) for g in residual_gpus)),
        engines=len(phases), serving=phases.count("serving"), crashed=crashed,
        drained=tuple(sorted(g for g, fams in e.gpus.items() if fams.get("gpu_drained") == 1)),
        agent=e.info.get("mode") == "agent" and not e.stale, backend=e.info.get("backend"), simulated=simulated,
        taken_at=(e.ts - e.snapshot_age_s) if e.ts is not None else None, via="prometheus")


def _match(host: Host, exporters: list[Exporter]) -> Exporter | None:
    """The exporter that is this node: its name is the instance itself (a node found in Prometheus); else its name
    or address is the instance (port aside) or the hostname label; failing that, the short names agree (gpu01 and
    gpu01.cluster). Two candidates: the freshest wins."""
    hits = [e for e in exporters if e.instance == host.name]
    wanted = {n for n in (host.name, host.address) if n}
    if not hits:
        hits = [e for e in exporters if wanted & e.names()]
    if not hits:
        short = {_short(n) for n in wanted}
        hits = [e for e in exporters if short & {_short(n) for n in e.names()}]
    return max(hits, key=lambda e: e.ts or 0.0, default=None)


def read_fleet(settings: PromSettings, hosts: list[Host] | None, api: PrometheusApi | None = None) -> PromReading:
    """Rows for the nodes Prometheus has fresh series of; the others with the reason. Without an inventory
    (hosts None) the fleet is every node with gpuwarden series, named by its instance without the port (the SSH
    fallback then connects to that name). Raises PrometheusError when Prometheus does not answer."""
    api = api or settings.api()
    at, found, down = _exporters(api, settings)
    exporters = list(found.values())
    if hosts is None:
        hosts = _discovered(exporters)
    failing = [_without_port(s.labels.get("instance", "")) for s in down]
    rows: dict[str, NodeRow] = {}
    missing: dict[str, str] = {}
    matched: dict[str, Exporter] = {}
    found_for = {host.name: _match(host, exporters) for host in hosts}
    claimed: dict[tuple[str, str], list[str]] = {}
    for name, e in found_for.items():
        if e is not None:
            claimed.setdefault(e.key, []).append(name)
    for host in hosts:
        e = found_for[host.name]
        if e is None:
            fails = {host.name, host.address} & set(failing)
            missing[host.name] = "not in Prometheus" + (": its scrape fails (up=0)" if fails else "")
            continue
        others = [n for n in claimed[e.key] if n != host.name]
        if others:  # one address, several nodes (ports, users, a bastion): the series cannot say whose they are
            missing[host.name] = f"{', '.join(others)} match{'es' if len(others) == 1 else ''} the same series " \
                                 f"(instance {e.instance})"
            continue
        matched[host.name] = e
        if e.ts is None:
            missing[host.name] = "no gpuwarden_agent_info series in Prometheus"
        elif e.stale:
            missing[host.name] = "its agent serves a stale snapshot"
        elif at - e.ts + e.snapshot_age_s > settings.max_age_s:
            missing[host.name] = f"its series are older than {settings.max_age_s:g}s"
        else:
            rows[host.name] = _row(host, e)
    return PromReading(at, tuple(hosts), rows, missing, matched)


def _discovered(exporters: list[Exporter]) -> list[Host]:
    """The fleet when no inventory names it: a node per scraped instance, called by its address (what the SSH
    fallback connects to), or by the whole instance where several share one address."""
    instances = sorted({e.instance for e in exporters if e.ts is not None and e.instance})
    by_address: dict[str, list[str]] = {}
    for instance in instances:
        by_address.setdefault(_without_port(instance), []).append(instance)
    hosts = []
    for address, shared in sorted(by_address.items()):
        hosts += [Host(address)] if len(shared) == 1 else [Host(i, address=address) for i in shared]
    known = {h.address or h.name for h in hosts}
    # An exporter without an instance label: its hostname is all there is to call it.
    hosts += [Host(n) for n in sorted({e.hostname for e in exporters if e.ts is not None and not e.instance
                                       and e.hostname} - known)]
    return hosts


def history(settings: PromSettings, reading: PromReading, window_s: float, api: PrometheusApi | None = None,
            points: int = HISTORY_POINTS) -> dict[str, NodeHistory]:
    """Each matched node's last `window_s`: significant residual VRAM (summed over its GPUs) as a range query,
    engine crashes and error-level kernel findings counted over the window."""
    api = api or settings.api()
    end = reading.at
    step = max(window_s / points, 1.0)
    w = f"[{max(int(window_s), 1)}s]"
    by = "sum by (job, instance)"
    residual = api.query_range(
        f"{by} ({selector(settings, 'gpuwarden_gpu_residual_bytes')} * "
        f"{selector(settings, 'gpuwarden_gpu_residual_significant')})", end - window_s, end, step)
    crashes = api.query(f"{by} (increase({selector(settings, 'gpuwarden_engine_crashes_total')}{w}))", at=end)
    findings = selector(settings, "gpuwarden_kernel_findings_total", 'severity=~"error|critical"')
    kernel = api.query(f"{by} (increase({findings}{w}))", at=end)

    def key(labels: dict[str, str]) -> tuple[str, str]:
        return labels.get("job", ""), labels.get("instance", "")

    series = {key(s.labels): s.points for s in residual}
    crash_n = {key(s.labels): s.value for s in crashes}
    kernel_n = {key(s.labels): s.value for s in kernel}
    out = {}
    for node, e in reading.exporters.items():
        out[node] = NodeHistory(window_s, step, tuple((t, max(0.0, v)) for t, v in series.get(e.key, ())),
                                # increase() extrapolates to the window's edges: 0.97 crashes is one crash.
                                crashes=round(crash_n.get(e.key, 0.0)), kernel_errors=round(kernel_n.get(e.key, 0.0)))
    return out



def vram_history(settings: PromSettings, exporter: Exporter, start: float, end: float, step: float,
                 api: PrometheusApi | None = None) -> list[tuple[int, float, float]]:
    """(gpu, ts, VRAM used fraction) of one node's GPUs over [start, end]: the console's sparklines before it
    opened."""
    api = api or settings.api()
    # json.dumps quotes a label value the way PromQL string literals are written.
    who = (f"job={json.dumps(exporter.job)}", f"instance={json.dumps(exporter.instance)}")
    used = selector(settings, "gpuwarden_gpu_vram_used_bytes", *who)
    total = selector(settings, "gpuwarden_gpu_vram_total_bytes", *who)
    out = []
    for s in api.query_range(f"{used} / {total}", start, end, step):
        gpu = s.labels.get("gpu", "")
        if gpu.isdigit():
            out += [(int(gpu), t, v) for t, v in s.points if math.isfinite(v)]
    return out
