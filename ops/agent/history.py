"""Per-GPU history: used, residual, holder count, VRAM fragmentation (per mille, from the driver's books) and
busy, power, temperature and shader clock at every refresh for the last hour, and per minute for seven days; the
minute trend is appended to the state dir, so it survives a restart.

Memory is bounded by fixed rings (array module, no per-sample objects): for 8 GPUs at 1 s, about 4.6 MiB.
"""

from __future__ import annotations

import json
import math
import threading
import time
from array import array
from pathlib import Path
from typing import Any

from gpuwarden.ops.config.keys import MIN_REFRESH_S
from gpuwarden.ops.foundation.jsondoc import document, iso
from gpuwarden.ops.foundation.model import GpuInfo, NodeSnapshot
from gpuwarden.ops.foundation.statedir import atomic_write
from gpuwarden.ops.agent import jsonlines
from gpuwarden.ops.agent.writewatch import WriteWatch, ignore

FINE_SPAN_S = 3600.0  # the refresh-resolution series covers the last hour
MINUTE_S = 60.0
MINUTES = 7 * 24 * 60  # the minute series covers seven days
TREND = "trend.jsonl"
UNKNOWN = -(1 << 63)  # a residual the backend could not compute
NO_FRAG = -1  # no fragmentation reading (no debugfs, NVIDIA, not root)


class Ring:
    """A fixed-size ring of rows: a time column "t" (float) and integer columns, one array each; append()
    overwrites the oldest."""

    def __init__(self, capacity: int, columns: dict[str, str]):
        self.capacity = capacity
        self.t = array("d", [0.0]) * capacity
        self.cols = {name: array(code, [0]) * capacity for name, code in columns.items()}
        self.start = 0
        self.count = 0

    def append(self, t: float, **values: int) -> None:
        i = (self.start + self.count) % self.capacity
        self.t[i] = t
        for name, col in self.cols.items():
            col[i] = values[name]
        if self.count < self.capacity:
            self.count += 1
        else:
            self.start = (self.start + 1) % self.capacity

    def rows_since(self, t: float) -> list[int]:
        """Ring positions of the rows whose "t" is >= t, oldest first."""
        ts = self.t
        out = []
        for k in range(self.count):
            i = (self.start + k) % self.capacity
            if ts[i] >= t:
                out.append(i)
        return out

    def nbytes(self) -> int:
        return self.t.itemsize * len(self.t) + sum(c.itemsize * len(c) for c in self.cols.values())


# Sensor columns of the fine series (integers, UNKNOWN where the source had no reading): name -> (GpuInfo reading,
# scale to the stored integer).
SENSOR_COLUMNS = {"busy_percent": 1, "power_mw": 1000, "temperature_mc": 1000, "sclk_mhz": 1}


def _fine_ring(capacity: int) -> Ring:
    return Ring(capacity, {"used": "q", "residual": "q", "holders": "i", "fragmentation_permille": "i",
                           **dict.fromkeys(SENSOR_COLUMNS, "q")})


def _sensor_values(g: GpuInfo) -> dict[str, int]:
    sclk = g.sensors.sclk_mhz if g.sensors is not None else None
    raw = {"busy_percent": g.busy_percent, "power_mw": g.power_w, "temperature_mc": g.temperature_c, "sclk_mhz": sclk}
    out: dict[str, int] = {}
    for name, scale in SENSOR_COLUMNS.items():
        value = raw[name]
        out[name] = UNKNOWN if value is None else round(value * scale)
    return out


def _minute_ring() -> Ring:
    return Ring(MINUTES, {"used_avg": "q", "used_max": "q", "residual_max": "q", "holders_max": "i",
                          "fragmentation_permille_max": "i"})


class _Minute:
    """The minute being accumulated for one GPU."""

    __slots__ = ("start", "n", "used_sum", "used_max", "residual_max", "holders_max", "frag_max")

    def __init__(self, start: float):
        self.start = start
        self.n = 0
        self.used_sum = 0
        self.used_max = 0
        self.residual_max = UNKNOWN
        self.holders_max = 0
        self.frag_max = NO_FRAG

    def add(self, used: int, residual: int, holders: int, frag: int = NO_FRAG) -> None:
        self.n += 1
        self.used_sum += used
        self.used_max = max(self.used_max, used)
        self.residual_max = max(self.residual_max, residual)
        self.holders_max = max(self.holders_max, holders)
        self.frag_max = max(self.frag_max, frag)

    def row(self) -> dict[str, int]:
        """The minute's integer columns (its time is `start`)."""
        return {"used_avg": self.used_sum // max(1, self.n), "used_max": self.used_max,
                "residual_max": self.residual_max, "holders_max": self.holders_max,
                "fragmentation_permille_max": self.frag_max}


class History:
    """Fed one snapshot per refresh (add); read by the API, the exporter and `gpuwarden history`.

    Thread-safe: the agent's sampling thread writes while API threads read."""

    def __init__(self, directory: Path | None, interval_s: float = 1.0, *, writable: bool = True,
                 watch: WriteWatch | None = None):
        self.dir = directory
        self.interval_s = interval_s
        self.watch = watch or ignore()
        # The history's own time line: wall-clock time, except that it never runs backwards. A clock stepped
        # back (NTP, an operator) shifts later rows by the step, so every series stays ordered.
        self._last_t = float("-inf")
        self.skew_s = 0.0
        self._fine_capacity = max(60, math.ceil(FINE_SPAN_S / max(interval_s, MIN_REFRESH_S)))
        self._fine: dict[int, Ring] = {}
        self._minutes: dict[int, Ring] = {}
        self._open: dict[int, _Minute] = {}
        self._lock = threading.Lock()
        self._trend: jsonlines.Appender | None = None
        self._trend_lines = 0
        if directory is not None:
            if writable:
                jsonlines.repair(directory / TREND)
            self._load()
            if writable:
                self._trend = jsonlines.Appender(directory / TREND)

    # --- feeding --------------------------------------------------------------------------------
    def add(self, snap: NodeSnapshot) -> float:
        """Record a snapshot; returns how far the wall clock was found stepped back (0.0 almost always)."""
        stepped = self._stamp(snap.taken_at)
        t = snap.taken_at + self.skew_s
        minute = math.floor(t / MINUTE_S) * MINUTE_S
        res_by_gpu = {r.gpu_index: r for r in snap.residual}
        frag_by_gpu = {v["gpu"]: round(1000 * v["fragmentation"]) for v in (snap.driver or {}).get("vram_free") or ()
                       if isinstance(v, dict) and isinstance(v.get("fragmentation"), (int, float))}
        closed: dict[int, dict[str, int]] = {}
        closed_t = 0.0  # the minute the first closed row began (the trend line's time)
        with self._lock:
            for g in snap.gpus:
                r = res_by_gpu.get(g.index)
                used = g.vram_used if g.vram_used is not None else 0
                residual = r.residual if r is not None and r.residual is not None else UNKNOWN
                holders = len(r.holders) if r is not None else 0
                ring = self._fine.get(g.index)
                if ring is None:
                    ring = self._fine[g.index] = _fine_ring(self._fine_capacity)
                frag = frag_by_gpu.get(g.index, NO_FRAG)
                ring.append(t=t, used=used, residual=residual, holders=holders, fragmentation_permille=frag,
                            **_sensor_values(g))
                cur = self._open.get(g.index)
                if cur is not None and cur.start != minute:
                    if not closed:
                        closed_t = cur.start
                    closed[g.index] = cur.row()
                    self._minute_ring(g.index).append(t=cur.start, **closed[g.index])
                    cur = None
                if cur is None:
                    cur = self._open[g.index] = _Minute(minute)
                cur.add(used, residual, holders, frag)
        if closed:
            self._persist(closed_t, closed)
        return stepped

    def _stamp(self, wall: float) -> float:
        t = wall + self.skew_s
        stepped = 0.0
        if t < self._last_t:
            stepped = self._last_t - t
            self.skew_s += stepped + 1e-3
        self._last_t = wall + self.skew_s
        return stepped

    def _minute_ring(self, gpu: int) -> Ring:
        ring = self._minutes.get(gpu)
        if ring is None:
            ring = self._minutes[gpu] = _minute_ring()
        return ring

    # --- persistence ----------------------------------------------------------------------------
    def _persist(self, t: float, rows: dict[int, dict[str, int]]) -> None:
        if self._trend is None:
            return
        line = {"t": t, "gpus": {str(g): [r["used_avg"], r["used_max"], r["residual_max"], r["holders_max"],
                                          r["fragmentation_permille_max"]] for g, r in rows.items()}}
        try:
            self._trend.append(line)
        except OSError as exc:  # a full disk must not stop sampling; the in-memory trend goes on
            self.watch.failed("history", self._trend.path, exc)
            return
        self.watch.ok("history")
        self._trend_lines += 1
        if self._trend_lines > 2 * MINUTES:
            self._compact()

    def _load(self) -> None:
        assert self.dir is not None
        path = self.dir / TREND
        cutoff = time.time() - MINUTES * MINUTE_S
        for line in jsonlines.read(path):
            t = line.get("t")
            gpus = line.get("gpus")
            if not isinstance(t, (int, float)) or t < cutoff or not isinstance(gpus, dict):
                continue
            for g, vals in gpus.items():
                # 4 values before fragmentation was recorded, 5 since
                if not (str(g).isdigit() and isinstance(vals, list) and len(vals) in (4, 5)
                        and all(isinstance(v, int) for v in vals)):
                    continue
                self._minute_ring(int(g)).append(t=t, used_avg=vals[0], used_max=vals[1], residual_max=vals[2],
                                                 holders_max=vals[3],
                                                 fragmentation_permille_max=vals[4] if len(vals) == 5 else NO_FRAG)
            self._trend_lines += 1

    def _compact(self) -> None:
        """Rewrite the trend file with the last seven days only (atomically: a kill leaves old or new)."""
        assert self.dir is not None and self._trend is not None
        by_t: dict[float, dict[str, list[int]]] = {}
        with self._lock:
            for g, ring in self._minutes.items():
                c = ring.cols
                for i in ring.rows_since(float("-inf")):
                    by_t.setdefault(ring.t[i], {})[str(g)] = [c["used_avg"][i], c["used_max"][i],
                                                             c["residual_max"][i], c["holders_max"][i],
                                                             c["fragmentation_permille_max"][i]]
        text = "".join(json.dumps({"t": t, "gpus": gpus}, separators=(",", ":")) + "\n"
                       for t, gpus in sorted(by_t.items()))
        try:
            atomic_write(self.dir / TREND, text, 0o640, root=self.dir)
        except OSError as exc:  # the old file stays whole (atomic): keep appending to it and compact later
            self.watch.failed("history", self.dir / TREND, exc)
            return
        self._trend.close()
        self._trend = jsonlines.Appender(self.dir / TREND)
        self._trend_lines = len(by_t)

    def close(self) -> None:
        if self._trend is not None:
            self._trend.close()
            self._trend = None

    # --- reading --------------------------------------------------------------------------------
    def nbytes(self) -> int:
        """Bytes the rings hold now (their capacity is allocated up front)."""
        with self._lock:
            return sum(r.nbytes() for r in list(self._fine.values()) + list(self._minutes.values()))

    def gpus(self) -> list[int]:
        with self._lock:
            return sorted(set(self._fine) | set(self._minutes))

    def series(self, gpu: int, since: float | None = None, resolution: str = "auto") -> dict[str, Any]:
        """{"fine": {...}, "minute": {...}} for one GPU: t0 (+ _iso), offsets from t0 in seconds, columns.

        "auto" gives the fine series when `since` lies within its span, else the minute series."""
        since = since if since is not None else float("-inf")
        out: dict[str, Any] = {}
        with self._lock:
            fine, minutes = self._fine.get(gpu), self._minutes.get(gpu)
            want_fine = resolution == "fine" or (resolution == "auto" and (
                since >= time.time() - FINE_SPAN_S or minutes is None))
            if fine is not None and want_fine:
                out["fine"] = _columns(fine, since)
            if minutes is not None and (resolution == "minute" or (resolution == "auto" and not want_fine)):
                cur = self._open.get(gpu)
                out["minute"] = _columns(minutes, since, extra=(cur.start, cur.row()) if cur is not None and cur.n else None)
        return out

    def document(self, gpu: int | None = None, since: float | None = None, resolution: str = "auto",
                 events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The gpuwarden.history/1 document."""
        now = time.time()
        gpus = [gpu] if gpu is not None else self.gpus()
        body: dict[str, Any] = {
            "generated_at": now, "generated_at_iso": iso(now), "interval_s": self.interval_s,
            "since": since, "since_iso": iso(since) if since is not None else None, "resolution": resolution,
            "gpus": {str(g): self.series(g, since, resolution) for g in gpus},
        }
        if events is not None:
            body["events"] = events
        return document("history", body)


def _columns(ring: Ring, since: float, extra: tuple[float, dict[str, int]] | None = None) -> dict[str, Any]:
    """The rows since `since` (and `extra`, the (t, columns) of a row not in the ring yet) as a series."""
    rows = ring.rows_since(since)
    c = ring.cols
    ts = [ring.t[i] for i in rows]
    data: dict[str, list[int | None]] = {n: [c[n][i] for i in rows] for n in c}
    if extra is not None and extra[0] >= since:
        ts.append(extra[0])
        for n in c:
            data[n].append(extra[1][n])
    for n in ("residual", "residual_max", *SENSOR_COLUMNS):
        if n in data:
            data[n] = [None if v == UNKNOWN else v for v in data[n]]
    for n in ("fragmentation_permille", "fragmentation_permille_max"):
        if n in data:
            data[n] = [None if v == NO_FRAG else v for v in data[n]]
    t0 = ts[0] if ts else None
    return {"t0": t0, "t0_iso": iso(t0), "t": [round(t - t0, 3) for t in ts] if t0 is not None else [],
            "points": len(ts), **data}


def read_trend(directory: Path) -> History:
    """The persisted minute trend of a stopped agent, read-only (nothing is repaired or appended)."""
    return History(directory, writable=False)
