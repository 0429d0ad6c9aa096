"""The agent's policies: run the same playbooks an operator would (same locks, checks and journal) when the
node config's [agent] table asks for it. All are off by default.

bundle_on: an incident bundle on residual / crash / kernel-fault events, at most one per bundle_min_interval.
purge_dead_holders: a purge limited to zombies whose parents are only asked to reap (never a live process).
drain_on_residual_after: drain a GPU whose residual VRAM has lasted that long (once per episode).
One worker thread runs them one at a time, so the sampling never waits for a playbook.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.agent.kernelwatch import FAULT_CATEGORIES
from gpuwarden.ops.foundation.model import NodeSnapshot
from gpuwarden.ops.sampling.changes import NodeEvent

from gpuwarden.playbooks.framework import Event, Playbook, run
from gpuwarden.playbooks.bundle import BundlePlaybook
from gpuwarden.playbooks.drain import DrainPlaybook
from gpuwarden.playbooks.purge import PurgePlaybook

_LEVEL = {"step_failed": "error", "step_ok": "info", "step_skipped": "info", "done": "info"}


class Policies:
    """An agent observer (on_snapshot / reload / close) that queues playbooks for its worker thread."""

    def __init__(self, agent, config: AgentConfig):
        self.agent = agent
        self.config = config
        self._queue: queue.Queue[tuple[str, Playbook] | None] = queue.Queue(maxsize=16)
        self._cancel = threading.Event()  # set when the agent stops: a running playbook ends after its step
        self._last_bundle = float("-inf")
        self._drained_for: set[int] = set()  # GPUs drained for the residual episode now going on
        self._purged: set[tuple[int, int | None, float | None]] = set()  # (gpu, pid, start) already purged
        self._worker = threading.Thread(target=self._work, name="gpuwarden-policies", daemon=True)
        self._worker.start()

    def reload(self, config: AgentConfig) -> None:
        self.config = config

    def close(self) -> None:
        self._cancel.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._worker.join(1.0)  # the agent must stop within 2 s; the journal says where a playbook stopped

    # --- deciding (in the sampling thread: quick) ------------------------------------------------
    def on_snapshot(self, snap: NodeSnapshot, events: list[dict[str, Any]]) -> None:
        cfg = self.config
        if cfg.bundle_on:
            trigger = self._bundle_trigger(events, cfg.bundle_on)
            if trigger and time.monotonic() - self._last_bundle >= cfg.bundle_min_interval:
                self._last_bundle = time.monotonic()
                self._submit(f"bundle on {trigger}", BundlePlaybook())
        if cfg.purge_dead_holders:
            self._purge(snap)
        if cfg.drain_on_residual_after is not None:
            self._drain(snap, cfg.drain_on_residual_after)

    def on_event(self, record: dict[str, Any]) -> None:
        """Kernel findings come without a snapshot: they can trigger a bundle on their own."""
        cfg = self.config
        if record.get("kind") != "kernel" or not cfg.bundle_on:
            return
        trigger = self._bundle_trigger([record], cfg.bundle_on)
        if trigger and time.monotonic() - self._last_bundle >= cfg.bundle_min_interval:
            self._last_bundle = time.monotonic()
            self._submit(f"bundle on {trigger}", BundlePlaybook())

    @staticmethod
    def _bundle_trigger(events: list[dict[str, Any]], wanted: tuple[str, ...]) -> str | None:
        for e in events:
            kind = e.get("kind")
            if "residual" in wanted and kind == "residual-appeared":
                return f"residual on GPU {e.get('gpu')}"
            if "crash" in wanted and kind == "engine-crashed":
                return f"crash of engine {e.get('data', {}).get('engine')}"
            if "kernel-fault" in wanted and kind == "kernel" and e.get("data", {}).get("category") in FAULT_CATEGORIES:
                return f"kernel fault ({e['data'].get('rule')})"
        return None

    def _purge(self, snap: NodeSnapshot) -> None:
        for r in snap.residual:
            zombies = [h for h in r.holders if h.reason == "zombie"]
            fresh = [h for h in zombies if (r.gpu_index, h.pid, h.start_time) not in self._purged]
            if not fresh:
                continue
            self._purged.update((r.gpu_index, h.pid, h.start_time) for h in fresh)
            self._submit(f"purge dead holders on GPU {r.gpu_index}", PurgePlaybook(r.gpu_index, dead_only=True))
        if len(self._purged) > 4096:
            self._purged.clear()

    def _drain(self, snap: NodeSnapshot, after_s: float) -> None:
        since = self.agent.changes.residual_since
        for r in snap.residual:
            g = r.gpu_index
            if not r.significant:
                self._drained_for.discard(g)
                continue
            started = since.get(g)
            if started is None or g in snap.drained or g in self._drained_for:
                continue
            if snap.taken_at - started >= after_s:
                self._drained_for.add(g)
                self._submit(f"drain GPU {g}: residual VRAM for {snap.taken_at - started:.0f}s",
                             DrainPlaybook(g, reason=f"agent policy: residual VRAM lasted {after_s:g}s"))

    def _submit(self, why: str, playbook: Playbook) -> None:
        try:
            self._queue.put_nowait((why, playbook))
        except queue.Full:
            self.agent.emit(NodeEvent(time.time(), "warning", f"policy skipped ({why}): playbooks queued up",
                                      "policy"))

    # --- running (in the worker thread) ----------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._cancel.is_set():
                return
            why, playbook = item
            self.agent.emit(NodeEvent(time.time(), "warning", f"policy: {why}: running {playbook.name}", "policy",
                                      None, {"playbook": playbook.name, "why": why}))
            try:
                result = run(playbook, self.agent.settings, sink=self._forward, assume_yes=True, lock_wait_s=30.0,
                             cancelled=self._cancel)
                level = "ok" if result.ok else "error"
                outcome = "done" if result.ok else (result.refused or f"failed at {result.failed_step}")
            except Exception as exc:  # the worker outlives any one playbook
                level, outcome = "error", f"{type(exc).__name__}: {exc}"
            self.agent.emit(NodeEvent(time.time(), level, f"policy: {playbook.name}: {outcome}", "policy", None,
                                      {"playbook": playbook.name, "why": why}))

    def _forward(self, event: Event) -> None:
        if event.kind in ("step_ok", "step_failed", "step_skipped"):
            self.agent.emit(NodeEvent(event.ts, _LEVEL[event.kind], f"{event.playbook}/{event.step}: {event.message}",
                                      "playbook", None, {"playbook": event.playbook, "step": event.step,
                                                         "kind": event.kind}))
