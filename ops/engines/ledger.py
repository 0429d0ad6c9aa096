"""An engine's KFD ledger as the interposer reports it: pinned host memory live and at peak, and its failed calls.

The shim feeds every status event in and keeps `record` in the engine's state.json ("host_ledger"); engines list,
status, the TUI's arena panel and the metrics read it there as gpuwarden.ops.foundation.model.HostLedger.

Why it matters: KFD charges a pinned host allocation (HIP's hipHostMalloc is a GTT-domain allocation) against the same
node-wide system-memory limit as a host registration (Linux amdgpu_amdkfd_gpuvm.c,
amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu -> amdgpu_amdkfd_reserve_mem_limit), once per process that allocates.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.ops.foundation.status_protocol import StatusEvent

# The interposer's phases for pinned host memory (native/interpose.c do_alloc/do_free, native/ledger.c).
CALLS = {"host-alloc": "alloc", "host-alloc-failed": "alloc", "host-free": "free", "host-free-failed": "free"}
PHASES = (*CALLS, "host-ledger")
# The running totals each of those lines carries, per process.
TOTALS = ("pinned_bytes", "pinned_count", "peak_bytes", "allocs", "frees", "alloc_bytes", "failed", "untracked",
          "unknown_frees")
KEEP_FAILURES = 8  # the newest failed calls kept (restarts included)
KEEP_CALLS = 16  # the newest calls that got a line of their own (threshold bytes or more, or failed)
KEEP_PROCESSES = 64  # an engine's processes followed at once (its workers inherit the preload)


def empty() -> dict[str, Any]:
    return {**dict.fromkeys(TOTALS, 0), "processes": {}, "failures": [], "calls": [], "run_started": None,
            "updated_at": None}


class HostLedgerLog:
    def __init__(self, record: dict[str, Any] | None = None):
        self.record: dict[str, Any] = record if record is not None else empty()

    def new_run(self, ts: float) -> None:
        """The engine starts (again): the processes of the last run are gone, their charges with them; the failed
        calls stay (the newest KEEP_FAILURES of them) so that a crash loop still shows why."""
        failures = self.record.get("failures", [])
        self.record = empty()
        self.record["failures"] = failures
        self.record["run_started"] = ts

    def on_event(self, event: StatusEvent) -> dict[str, Any] | None:
        """Apply one status event; the failed call's record when it reported one, the ledger when it moved,
        None when the event was about something else."""
        if event.phase not in PHASES:
            return None
        data = event.data
        pid = data.get("pid")
        key = str(pid) if isinstance(pid, int) and not isinstance(pid, bool) else "?"
        processes: dict[str, Any] = self.record.setdefault("processes", {})
        proc = processes.get(key)
        if proc is None:
            if len(processes) >= KEEP_PROCESSES:
                return None  # said in engines list: "followed N processes"
            proc = processes[key] = dict.fromkeys(TOTALS, 0)
        for name in TOTALS:
            value = _count(data.get(name))
            if value is not None:
                proc[name] = value
        proc["updated_at"] = event.ts
        for name in TOTALS:
            self.record[name] = sum(p.get(name, 0) for p in processes.values())
        self.record["updated_at"] = event.ts
        if event.phase not in CALLS:
            return self.record
        call = {"kind": CALLS[event.phase], "call": _text(data.get("call")), "bytes": _count(data.get("bytes")),
                "flags": _count(data.get("flags")), "result": _int(data.get("result")), "ts": event.ts,
                "seconds": _num(data.get("seconds")), "pid": pid if key != "?" else None, "via": _text(data.get("via"))}
        self.record["calls"] = [*self.record.get("calls", []), call][-KEEP_CALLS:]
        if event.phase.endswith("-failed"):
            self.record["failures"] = [*self.record.get("failures", []), call][-KEEP_FAILURES:]
            return call
        return self.record


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    n = _int(value)
    return n if n is not None and n >= 0 else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value[:64] if isinstance(value, str) else None
