"""The Agent: one Sampler for the node in a SamplingThread, its history and event log, the kernel-log watch
and the API server; signals (TERM stops, HUP reloads the config) and sd_notify for systemd.

Hooks for what builds on it (the exporter, the k8s reconciler, the policies): `add_annotator(fn)`, where
fn(snapshot) -> snapshot adds to each snapshot in the sampling thread before anyone sees it (Kubernetes pod
names); `add_observer(obj)`, where obj.on_snapshot(snapshot, events) runs in the sampling thread after each
snapshot, and the optional
obj.on_event(record), obj.reload(config) and obj.close() run on every event, SIGHUP and stop (keep them quick:
do slow work in a thread of your own; an exception is logged and the observer kept); `latest()`, `history`
and `events` serve in-process readers.
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, TextIO

from gpuwarden.ops import __version__
from gpuwarden.ops.config import loader
from gpuwarden.ops.config.keys import MIN_REFRESH_S
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.jsondoc import iso, document
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.foundation.paths import AGENT_SOCKET
from gpuwarden.ops.sampling.changes import ChangeTracker, NodeEvent
from gpuwarden.ops.sampling.thread import SamplingThread
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.sampling.sampler import Sampler
from gpuwarden.ops.foundation.statedir import ensure
from gpuwarden.ops.agent.events import EventLog
from gpuwarden.ops.agent.history import History
from gpuwarden.ops.agent.notify import notify
from gpuwarden.ops.agent.writewatch import WriteWatch
from gpuwarden.ops.services import agent_api as api
from gpuwarden.ops.agent.kernelwatch import KernelWatch

AGENT_DIR = "agent"
STALE_INTERVALS = 3.0  # no snapshot for this many intervals (plus STALE_GRACE_S): the API says stale
STALE_GRACE_S = 2.0
# Per-process GPU% has a reader while a /v1/snapshot or a per-process /metrics was served within this (a console,
# `status --watch`, a fleet view or a scraper asks far more often); with none, a dear source is asked seldom.
PROCESS_GPU_READERS_S = 120.0
_PRIORITY = {"error": 3, "warning": 4, "ok": 5, "info": 6}
# How long the sampling thread may hold the GIL while an API thread waits for it (CPython's default: 5 ms). A
# big node's refresh and its JSON are several ms of Python each second; a request arriving meanwhile waited
# up to 5 ms per turn, which was the /v1/snapshot p99. Switches happen only while two threads want to run.
SWITCH_INTERVAL_S = 0.0005


def socket_path(state_dir: Path) -> Path:
    return state_dir / AGENT_SOCKET


def agent_dir(state_dir: Path) -> Path:
    return state_dir / AGENT_DIR


class Observer(Protocol):
    def on_snapshot(self, snapshot: NodeSnapshot, events: list[dict[str, Any]]) -> None: ...


@dataclass(frozen=True)
class Latest:
    snapshot: NodeSnapshot
    received: float  # time.monotonic() when it arrived

    def age_s(self) -> float:
        return time.monotonic() - self.received


class Agent:
    def __init__(self, settings: Settings, config: AgentConfig, *, sampler: Sampler | None = None,
                 log_stream: TextIO | None = None, socket: Path | None = None):
        self.settings = settings
        self.config = config
        self.dir = agent_dir(settings.state_dir)
        self.socket = socket or socket_path(settings.state_dir)
        self._sampler = sampler
        self._log_stream = log_stream if log_stream is not None else sys.stderr
        self._journal_prefix = bool(os.environ.get("JOURNAL_STREAM"))
        self.observers: list[Observer] = []
        self.annotators: list[Callable[[NodeSnapshot], NodeSnapshot]] = []
        self.metrics: api.MetricsText | None = None  # the MetricsExporter (gpuwarden.ops.metrics) when one is attached: the API's /metrics
        self.started_at = time.time()
        self.stopping = False
        self.writes = WriteWatch(self.log)  # which of the state dir's files cannot be written right now
        self._done = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()  # set with _done or _reload: the main loop's wake-up
        self._process_gpu_read_at = -PROCESS_GPU_READERS_S  # monotonic: when per-process GPU% was last served
        self._latest: Latest | None = None
        # (the snapshot, its JSON body, needs attention): the object itself, since a freed snapshot's id() is
        # soon another's
        self._served: tuple[NodeSnapshot, bytes, bool] | None = None
        # The last snapshot a client asked for (not merely one made ahead for it): what _deliver's guess goes by.
        self._asked: NodeSnapshot | None = None
        self._serve_lock = threading.Lock()
        self._failure: str | None = None
        self._stale_reported = False
        self.changes = ChangeTracker()
        self.history: History
        self.events: EventLog
        self._thread: SamplingThread | None = None
        self._server: api.ApiServer | None = None
        self._server_thread: threading.Thread | None = None
        self._kernel: KernelWatch | None = None
        self._lock_fd: int | None = None

    # --- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Take the agent lock, open history and events, start sampling, the kernel watch and the API."""
        ensure(self.settings.state_dir, AGENT_DIR)
        self._lock()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.history = History(self.dir, self.config.interval, watch=self.writes)
        self.events = EventLog(self.dir, self.config.events_max, watch=self.writes)
        sampler = self._sampler
        if sampler is None:
            sampler = self._sampler = Sampler(self.settings, deep_every_s=self.config.deep_scan_interval)
        sampler.deep_every_s = self.config.deep_scan_interval
        sampler.full_scan_every_s = self.config.full_scan_interval
        self._apply_group()
        server = self._server = api.bind(self.socket, self, self.config.socket_group)
        self._server_thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                               name="gpuwarden-api", daemon=True)
        self._server_thread.start()
        # The thread closes the sampler (NVML, held files, pidfds) after its last call, never during one.
        self._thread = SamplingThread(self._sample, self.config.interval, self._deliver, self._failed,
                                      close=sampler.close, name="gpuwarden-agent-sampler")
        self._thread.start()
        self._start_kernel_watch()
        self.emit(NodeEvent(time.time(), "info", f"agent started (pid {os.getpid()}): every {self.config.interval:g}s "
                            f"via {sampler.backend.name}, API on {self.socket}", "agent"))

    def _lock(self) -> None:
        path = self.dir / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise GpuwardenError(f"an agent already runs for {self.settings.state_dir} (pid {holder})",
                                 "stop it first, or give this one another --state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _apply_group(self) -> None:
        """With a socket group, the group may traverse the state dir (not list it) to reach the socket."""
        group = self.config.socket_group
        if not group:
            return
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise GpuwardenError(f"[agent] socket_group {group!r} is not a group on this node",
                                 "create it (groupadd) or fix the node config") from None
        state = self.settings.state_dir
        os.chown(state, -1, gid)
        os.chmod(state, (os.stat(state).st_mode & 0o7777) | 0o010)

    def _start_kernel_watch(self) -> None:
        kernel = self._kernel = KernelWatch(self.config.kmsg, self.emit, gpu_pids=self._gpu_pids,
                                            state_file=self.dir / "kmsg.seq", watch=self.writes)
        self.log("info", f"kernel log: {kernel.start()}")

    def _gpu_pids(self) -> set[int]:
        latest = self._latest
        if latest is None:
            return set()
        snap = latest.snapshot
        return {p.pid for p in snap.processes} | {e.pid for e in snap.engines if e.pid}

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 0), reloading the config on SIGHUP; the main thread's loop."""
        def told(flag: threading.Event) -> Callable[..., None]:
            def handler(*_: object) -> None:
                flag.set()
                self._wake.set()
            return handler
        signal.signal(signal.SIGTERM, told(self._done))
        signal.signal(signal.SIGINT, told(self._done))
        signal.signal(signal.SIGHUP, told(self._reload))
        notify(f"READY=1\nSTATUS=sampling every {self.config.interval:g}s\nMAINPID={os.getpid()}")
        # Asleep until a signal, or until the latest snapshot would turn stale: the stale check used to wake this
        # thread every second (an idle agent's main thread: 0.14 ms/s); now it wakes about once per stale limit.
        while not self._done.is_set():
            self._wake.wait(self._until_stale())
            self._wake.clear()  # before the flags are read: a signal from now on wakes the next wait
            if self._done.is_set():
                break
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
            self._check_stale()
        self.stop()
        return 0

    def _until_stale(self) -> float:
        """Seconds until the latest snapshot turns stale if no newer one comes (a full limit once it is stale)."""
        stale, age = self.staleness()
        limit = self._stale_limit()
        if stale:
            return limit
        if age is None:
            age = time.time() - self.started_at
        return max(0.05, limit - age + 0.01)

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        notify("STOPPING=1")
        if self._thread is not None:
            self._thread.stop()  # a call in flight (a hung backend) is left to die with the process
        if self._kernel is not None:
            self._kernel.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            try:
                self.socket.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # a read-only state dir: the next agent replaces a socket nobody listens on
                self.log("warning", f"could not remove {self.socket} ({exc.strerror}): the next agent replaces it")
        for obs in self.observers:
            close = getattr(obs, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    self.log("error", f"observer {type(obs).__name__} failed to close: {exc}")
        self.emit(NodeEvent(time.time(), "info", "agent stopped", "agent"))
        self.history.close()
        self.events.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def reload(self) -> None:
        """SIGHUP: read the node config again; a config that does not load leaves the running one in place."""
        try:
            cfg = loader.agent_config(self.settings)  # the file again; --interval stays the file's on a reload
        except GpuwardenError as exc:
            self.log("error", f"reload refused, keeping the running config: {exc.message}")
            return
        old, self.config = self.config, cfg
        if self._thread is not None:
            self._thread.interval = max(cfg.interval, MIN_REFRESH_S)
        if self._sampler is not None:
            self._sampler.deep_every_s = cfg.deep_scan_interval
            self._sampler.full_scan_every_s = cfg.full_scan_interval
        if cfg.kmsg != old.kmsg and self._kernel is not None:
            self._kernel.stop()
            self._start_kernel_watch()
        for obs in self.observers:
            hook = getattr(obs, "reload", None)
            if hook is not None:
                hook(cfg)
        self.emit(NodeEvent(time.time(), "info", "agent reloaded its config", "agent", None,
                            {"config": cfg.to_dict()}))

    # --- sampling (called from the sampling thread) ---------------------------------------------
    def _sample(self) -> NodeSnapshot:
        if self._sampler is None:  # start() makes the sampler before the sampling thread that calls this
            raise RuntimeError("the agent samples only once started")
        sampler = self._sampler
        sampler.quiet_process_gpu(not self._process_gpu_read())
        snap = sampler.snapshot()
        for annotate in self.annotators:
            try:
                snap = annotate(snap)
            except Exception as exc:  # the node's own figures still count without the additions
                self.log("error", f"annotator {getattr(annotate, '__qualname__', annotate)}: "
                                  f"{type(exc).__name__}: {exc}")
        return snap

    def _deliver(self, snap: NodeSnapshot) -> None:
        if self._failure is not None or self._stale_reported:
            self.emit(NodeEvent(snap.taken_at, "ok", "sampling works again", "agent"))
        self._failure = None
        self._stale_reported = False
        before = self._latest
        if before is not None and self._asked is before.snapshot:
            # A client asked for the last snapshot: one that polls will ask for this one too. Its JSON is made
            # here, before it is published, so no client's request waits for it (none asks: none is made). It
            # goes by what was asked, not by what was made: a JSON made ahead and never asked for must not make
            # the next one (it did until issue 38's seventh session, so that one read made every later refresh
            # render its snapshot).
            made = self._render(snap)
            with self._serve_lock:
                self._served = made
        self._latest = Latest(snap, time.monotonic())
        records = [self.emit(e) for e in self.changes.feed(snap)]
        stepped = self.history.add(snap)
        if stepped > self.config.interval:
            self.emit(NodeEvent(snap.taken_at, "warning", f"the wall clock went back {stepped:.0f}s: the history "
                                f"keeps its own time line, {self.history.skew_s:.0f}s ahead of the clock", "agent"))
        for obs in list(self.observers):
            try:
                obs.on_snapshot(snap, records)
            except Exception as exc:  # one broken hook must not stop the sampling or the others
                self.log("error", f"observer {type(obs).__name__}: {type(exc).__name__}: {exc}")

    def _failed(self, message: str) -> None:
        if message != self._failure:
            self.emit(NodeEvent(time.time(), "error", f"sampling failed: {message}", "agent"))
        self._failure = message

    def _check_stale(self) -> None:
        stale, age = self.staleness()
        if stale and not self._stale_reported:
            self._stale_reported = True
            busy = self._thread.busy_for() if self._thread else None
            why = f"a backend call has been running for {busy:.0f}s" if busy else "sampling stopped"
            self.emit(NodeEvent(time.time(), "error", f"no snapshot for {age:.0f}s: {why}", "agent"))

    # --- readers ---------------------------------------------------------------------------------
    def add_observer(self, observer: Observer) -> None:
        self.observers.append(observer)

    def add_annotator(self, annotate: Callable[[NodeSnapshot], NodeSnapshot]) -> None:
        """Before start(): every snapshot passes through annotate() before history, the API and observers."""
        self.annotators.append(annotate)

    def latest(self) -> Latest | None:
        return self._latest

    def process_gpu_served(self) -> None:
        """Per-process GPU% went to a reader (a snapshot, a per-process exposition): keep it at its usual cadence."""
        self._process_gpu_read_at = time.monotonic()

    def _process_gpu_read(self) -> bool:
        metrics = self.metrics
        if metrics is not None and getattr(metrics, "scraped_per_process", False):
            return True  # a listener exporting per-process series: its scraper comes back on its own interval
        return time.monotonic() - self._process_gpu_read_at < PROCESS_GPU_READERS_S

    def _stale_limit(self) -> float:
        return STALE_INTERVALS * self.config.interval + STALE_GRACE_S

    def staleness(self) -> tuple[bool, float | None]:
        """(stale?, age in seconds of the latest snapshot; None before the first)."""
        latest = self._latest
        limit = self._stale_limit()
        if latest is None:
            age = time.time() - self.started_at
            return age > limit, None
        age = latest.age_s()
        return age > limit, age

    def snapshot_document(self) -> tuple[tuple[bytes, ...], bool, bool] | None:
        """(the latest snapshot's JSON with its "agent" block, in parts to be written as they are; needs
        attention?, stale?) for the API. The snapshot's part is made once per snapshot, never per request; the
        agent block (its age, whether stale) is a few dozen bytes made per request, and the parts are written in
        one gathered send, not joined (a copy of the whole answer per request)."""
        latest = self._latest
        if latest is None:
            return None
        self.process_gpu_served()
        self._asked = latest.snapshot
        served = self._serve(latest.snapshot)
        stale, age = self.staleness()
        tail = (f',"agent":{{"pid":{os.getpid()},"interval_s":{json.dumps(self.config.interval)},'
                f'"age_s":{json.dumps(round(age or 0.0, 3))},"stale":{"true" if stale else "false"},'
                f'"socket":{json.dumps(str(self.socket))}}}}}').encode()
        return (served[1], tail), served[2] or stale, stale

    def _serve(self, snap: NodeSnapshot) -> tuple[NodeSnapshot, bytes, bool]:
        """The snapshot's JSON (without its final "}") and needs-attention flag, made once per snapshot."""
        with self._serve_lock:
            served = self._served
            if served is None or served[0] is not snap:
                served = self._served = self._render(snap)
            return served

    @staticmethod
    def _render(snap: NodeSnapshot) -> tuple[NodeSnapshot, bytes, bool]:
        return snap, snap.to_json().encode()[:-1], snap.needs_attention()

    def backend_name(self) -> str:
        return self._sampler.backend.name if self._sampler is not None else ""

    def health(self) -> dict[str, Any]:
        stale, age = self.staleness()
        latest = self._latest
        busy = self._thread.busy_for() if self._thread else None
        now = time.time()
        return document("health", {
            "ok": latest is not None and not stale and self._failure is None,
            "version": __version__, "pid": os.getpid(), "started_at": self.started_at, "started_at_iso": iso(self.started_at),
            "uptime_s": round(now - self.started_at, 3), "interval_s": self.config.interval,
            "backend": self._sampler.backend.name if self._sampler else None,
            "last_snapshot_at": latest.snapshot.taken_at if latest else None,
            "last_snapshot_at_iso": iso(latest.snapshot.taken_at) if latest else None,
            "age_s": round(age, 3) if age is not None else None, "stale": stale,
            "sampling_error": self._failure, "busy_for_s": round(busy, 3) if busy is not None else None,
            "last_event_seq": self.events.last_seq,
            "kernel_watch": self._kernel.describe if self._kernel is not None else "off",
            "clients": self._server.active if self._server is not None else 0,
            "history_bytes": self.history.nbytes(),
            "writes_failing": self.writes.failing(),
        })

    # --- events and logging ----------------------------------------------------------------------
    def emit(self, event: NodeEvent) -> dict[str, Any]:
        """Record a node event (event log, API, stderr/journald) and return its record."""
        rec = self.events.append(event)
        self.log(event.level, event.text)
        for obs in list(self.observers):
            hook = getattr(obs, "on_event", None)
            if hook is not None:
                try:
                    hook(rec)
                except Exception as exc:
                    self.log("error", f"observer {type(obs).__name__}: {type(exc).__name__}: {exc}")
        return rec

    def log(self, level: str, text: str) -> None:
        prefix = f"<{_PRIORITY.get(level, 6)}>" if self._journal_prefix else ""
        try:
            self._log_stream.write(f"{prefix}gpuwarden-agent: {level}: {text}\n")
            self._log_stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone (a closed terminal): the event log still has it
