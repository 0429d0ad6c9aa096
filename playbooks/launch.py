"""The launch playbook: preflight, then start each engine under its shim and follow it to serving.

A crash before an engine registered stops the launch: it names the engine, its signal and its last log lines.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.ops.node import nodestate
from gpuwarden.ops.engines import control, runtime_errors
from gpuwarden.ops.engines import state as st, preload
from gpuwarden.ops.engines.progress import FAILED_REGISTRATION
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.config.nodeconfig import EngineConfig, NodeConfig
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.arena import budget
from gpuwarden.ops.arena.format import load_header
from gpuwarden.ops.arena.verify import verify

from gpuwarden.playbooks.framework import Playbook, RunContext, Step, StepFailed

LAST_LINES = 8


@dataclass
class LaunchPlaybook(Playbook):
    config: NodeConfig
    engines: tuple[EngineConfig, ...]
    stagger: int
    sequential: bool = False
    timeout_s: float | None = None  # None: each engine's registration timeout, summed, plus a margin
    skip_verify: bool = False
    poll_s: float = 0.05
    launch_id: str = field(default_factory=control.new_launch_id)

    name = "launch"
    destructive = False

    @property
    def description(self) -> str:  # type: ignore[override]
        how = "one after another" if self.sequential else f"at most {self.stagger} registering at once"
        return f"start {len(self.engines)} engine(s) under shims, {how}"

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({e.gpu for e in self.engines if e.gpu is not None}))

    def summary(self) -> dict[str, Any]:
        return {"engines": [e.name for e in self.engines], "stagger": self.stagger,
                "sequential": self.sequential, "launch_id": self.launch_id, "config": str(self.config.path)}

    # --- preflight -----------------------------------------------------------------------------

    def preconditions(self, ctx: RunContext) -> list[str]:
        problems = []
        if not self.engines:
            problems.append(f"no engines to launch: {self.config.path} lists none")
        drained = nodestate.drained(ctx.settings.state_dir)
        for e in self.engines:
            if e.gpu is not None and e.gpu in drained:
                d = drained[e.gpu]
                problems.append(f"GPU {e.gpu} (engine {e.name}) is drained"
                                f"{' by ' + d['who'] if d.get('who') else ''}"
                                f"{': ' + d['reason'] if d.get('reason') else ''}; "
                                f"undrain it (`gpuwarden undrain {e.gpu}`) or leave {e.name} out")
            if control.supervised(ctx.settings, e.name):
                problems.append(f"engine {e.name} is already running; stop it first "
                                f"(`gpuwarden engines stop {e.name}`)")
            missing = program_problem(e, self.config.path.resolve().parent)
            if missing:
                problems.append(f"engine {e.name}: {missing}; fix its argv in {self.config.path}")
        if any(e.progress == "preload" for e in self.engines):
            if preload.missing():
                problems.append(preload.missing())
        if self.config.arena is not None:
            if not Path(self.config.arena.path).exists():
                size = f"{self.config.arena.size}B" if self.config.arena.size else "SIZE"
                if self.config.arena.size and self.config.arena.size % (1 << 30) == 0:
                    size = f"{self.config.arena.size >> 30}GiB"
                problems.append(f"arena {self.config.arena.path} does not exist; create it first "
                                f"(`gpuwarden arena create {self.config.arena.path} --size {size}`)")
        return problems

    def plan(self, ctx: RunContext) -> list[Step]:
        steps = []
        if self.config.arena is not None:
            steps.append(Step("arena", f"verify the arena {self.config.arena.path}", self._check_arena))
            steps.append(Step("budget", "check the registration budget (KFD system-memory limit)", self._check_budget))
        names = ", ".join(f"{e.name}@GPU{e.gpu}" if e.gpu is not None else e.name for e in self.engines)
        steps.append(Step("start", f"start {names} under detached shims", self._start))
        steps.append(Step("follow", "follow every engine until it serves", self._follow))
        return steps

    def _check_arena(self, ctx: RunContext) -> str:
        arena = self.config.arena
        assert arena is not None
        if self.skip_verify:
            header = load_header(arena.path)
            return f"{arena.path}: header ok, {fmt_bytes(header.payload_size)} (chunks not hashed: --skip-verify)"
        result = verify(arena.path, expect_size=arena.size)
        return (f"{arena.path}: {fmt_bytes(result.header.payload_size)} verified in {result.seconds:.1f}s "
                f"on {result.workers} worker(s)")

    def _check_budget(self, ctx: RunContext) -> str:
        arena = self.config.arena
        assert arena is not None
        vendor = control.detect_vendor(ctx.settings)
        size = arena.size or load_header(arena.path).payload_size
        all_gpus = budget.count_gpus(ctx.settings.sysfs_root) or 1
        # The shim restricts an engine with a gpu to that one GPU; others see what their env allows.
        visible = [1 if e.gpu is not None else (budget.visible_count(e.env) or all_gpus) for e in self.engines]
        verdict = budget.compute(ctx.settings, size, visible, [e.name for e in self.engines])
        if vendor != "amd":
            return f"no KFD on this node, so no system-memory limit applies ({len(visible)} x {fmt_bytes(size)})"
        if not verdict.fits:
            # the registration that will fail comes first: that is the line an operator acts on
            raise StepFailed((verdict.crossing + "; " if verdict.crossing else "") + "registration budget exceeded: "
                             + "; ".join(verdict.lines()[1:4]),
                             "see `gpuwarden arena budget` for the details and `gpuwarden known arena` for the "
                             "other ways to share one host buffer")
        now = (f", {fmt_bytes(verdict.kfd_used)} already in use (debugfs kfd/mem_limit)"
               if verdict.kfd_used is not None else " (limit computed from RAM: debugfs not readable)")
        head = (f"KFD charges {fmt_bytes(verdict.charged)} for the registrations (once per engine process) of "
                f"{fmt_bytes(verdict.limit)}{now}")
        if verdict.verdict == "decided-by-pinned":
            ctx.info(f"warning: fits by registrations alone; not certain: {verdict.decides}")
            return f"fits by registrations: {head}; pinned headroom assumed, not measured"
        return f"fits: {head}, with {fmt_bytes(verdict.pinned_total)} of pinned headroom"

    # --- starting and following ---------------------------------------------------------------

    def _spawn(self, ctx: RunContext, engines: tuple[EngineConfig, ...]) -> None:
        pids = control.start_all(ctx.settings, engines, gate_slots=self.stagger,
                                 registration_timeout=self.config.stagger.registration_timeout,
                                 workdir=str(self.config.path.resolve().parent), launch_id=self.launch_id)
        for engine in engines:
            shim_pid = pids[engine.name]
            control.wait_for_record(ctx.settings, engine.name, shim_pid)
            ctx.scratch.setdefault("shims", {})[engine.name] = shim_pid
            ctx.info(f"{engine.name}: shim {shim_pid} started", engine=engine.name, shim_pid=shim_pid)

    def _start(self, ctx: RunContext) -> str:
        ctx.scratch["launched_at"] = time.time()
        # Sequential launches start each engine only when the one before serves (in _follow).
        first = self.engines[:1] if self.sequential else self.engines
        self._spawn(ctx, first)
        return f"{len(first)} shim(s) started" + (", the rest follow one by one" if self.sequential else "")

    def _timeout(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return self.config.stagger.registration_timeout * max(1, len(self.engines)) + 60.0

    def _follow(self, ctx: RunContext) -> str:
        t0 = ctx.scratch.get("launched_at", time.time())
        deadline = time.monotonic() + self._timeout()
        seen: dict[str, str] = {}
        started = {e.name for e in self.engines} if not self.sequential else {self.engines[0].name}
        pending = list(self.engines[1:]) if self.sequential else []
        while True:
            records = {e.name: st.read_state(ctx.settings.state_dir, e.name) or {} for e in self.engines}
            for name in sorted(started):
                record = records[name]
                phase = "stale" if record and st.is_stale(record, ctx.settings.proc_root) else record.get("phase", "starting")
                if seen.get(name) != phase:
                    seen[name] = phase
                    ctx.info(f"{name}: {phase} (+{time.time() - t0:.1f}s)", engine=name, phase=phase,
                             elapsed=round(time.time() - t0, 3))
                if phase in ("crashed", "stale") or (phase == "exited" and not record.get("stopped_by_request")):
                    self._abort(ctx, name, record, records, started)
                if phase == FAILED_REGISTRATION:
                    self._registration_failed(ctx, name, record, started)
            if self.sequential and pending and seen.get(self.engines[len(started) - 1].name) == "serving":
                nxt = pending.pop(0)
                started.add(nxt.name)
                self._spawn(ctx, (nxt,))
                continue
            if not pending and all(seen.get(n) == "serving" for n in started):
                took = time.time() - t0
                ctx.scratch["serving_s"] = round(took, 3)
                ctx.scratch["phases"] = {n: records[n].get("phases", {}) for n in started}
                return f"{len(started)} engine(s) serving after {took:.1f}s"
            if time.monotonic() > deadline:
                waiting = ", ".join(f"{n} ({seen.get(n, 'starting')})" for n in sorted(started) if seen.get(n) != "serving")
                first = next(n for n in sorted(started) if seen.get(n) != "serving")
                raise StepFailed(f"not all engines serve after {self._timeout():.0f}s: {waiting}",
                                 "they keep running under their shims; see `gpuwarden engines list` and "
                                 f"`gpuwarden engines logs {first}`")
            if ctx.cancelled.is_set():
                raise StepFailed("launch cancelled; started engines keep running under their shims")
            time.sleep(self.poll_s)

    def _hold_back(self, ctx: RunContext, name: str, started: set[str]) -> list[str]:
        """Stop the engines that had not begun registering (they would meet what `name` met)."""
        held_back = []
        for other in sorted(started - {name}):
            phase = (st.read_state(ctx.settings.state_dir, other) or {}).get("phase", "starting")
            if phase in ("waiting", "starting", "mapping", "verifying"):
                control.stop(ctx.settings, other, timeout_s=5.0)
                held_back.append(other)
        return held_back

    def _registration_failed(self, ctx: RunContext, name: str, record: dict[str, Any], started: set[str]) -> None:
        """A registration call returned an error: the launch has failed, now, whatever the engine says next."""
        failed = next((r for r in reversed(record.get("registrations") or [])
                       if isinstance(r, dict) and r.get("kind") == "register" and r.get("outcome") == "failed"), {})
        call = failed.get("call") or "the registration"
        error = runtime_errors.describe(failed.get("call"), failed.get("result"))
        seconds = failed.get("seconds")
        took = f" after {seconds:.3f}s" if isinstance(seconds, (int, float)) else ""
        held_back = self._hold_back(ctx, name, started)
        ctx.scratch["register_failed"] = {"engine": name, "call": failed.get("call"), "bytes": failed.get("bytes"),
                                          "result": failed.get("result"),
                                          "error": runtime_errors.name(failed.get("call"), failed.get("result")),
                                          "stopped_unregistered": held_back}
        for line in st.run_tail(st.engine_dir(ctx.settings.state_dir, name) / st.LOG, LAST_LINES):
            ctx.info(f"{name} | {line}", engine=name, log=line)
        parts = [f"engine {name}: {call} of {fmt_bytes(failed.get('bytes'))} returned {error}{took}"]
        if held_back:
            parts.append(f"stopped {', '.join(held_back)} (not yet registering)")
        left = sorted(started - {name} - set(held_back))
        if left:
            parts.append(f"left {', '.join(left)} as they are")
        raise StepFailed("; ".join(parts),
                         f"{name} keeps running without that memory registered and may crash when it uses it: stop it (`gpuwarden engines stop {name}`), see `gpuwarden engines logs "
                         f"{name}`, and check the registration budget (`gpuwarden arena budget`) before launching "
                         "again")

    def _abort(self, ctx: RunContext, name: str, record: dict[str, Any], records: dict[str, dict[str, Any]],
               started: set[str]) -> None:
        """An engine died: stop those that had not begun registering, leave the rest, and fail loudly."""
        while_phase = record.get("died_while") or "starting"
        if record.get("signal"):
            how = f"killed by {record['signal']}" + (" (core dumped)" if record.get("core_dumped") else "")
        elif record.get("phase") == "stale" or not record:
            how = "lost its shim"
        else:
            how = f"exited with code {record.get('exit_code')}"
        held_back = self._hold_back(ctx, name, started)
        if record.get("signal") and not record.get("bundle"):
            record = self._await_bundle(ctx, name, record)
        lines = st.run_tail(st.engine_dir(ctx.settings.state_dir, name) / st.LOG, LAST_LINES)
        for line in lines:
            ctx.info(f"{name} | {line}", engine=name, log=line)
        ctx.scratch["crashed"] = {"engine": name, "signal": record.get("signal"), "exit_code": record.get("exit_code"),
                                  "core_dumped": record.get("core_dumped"), "while": while_phase,
                                  "last_lines": lines, "stopped_unregistered": held_back}
        left = sorted(started - {name} - set(held_back))
        parts = [f"engine {name} {how} " + ("after its registration failed" if while_phase == FAILED_REGISTRATION
                                             else f"while {while_phase}")]
        if held_back:
            parts.append(f"stopped {', '.join(held_back)} (not yet registering)")
        if left:
            parts.append(f"left {', '.join(left)} as they are")
        raise StepFailed("; ".join(parts), f"see `gpuwarden engines logs {name}`"
                         + (f" and the incident bundle {record['bundle']}" if record.get("bundle")
                            else f" ({record['bundle_note']})" if record.get("bundle_note") else ""))


    # The shim collects the crash bundle in safe mode with a 5 s collector timeout.
    BUNDLE_WAIT_S = 8.0

    def _await_bundle(self, ctx: RunContext, name: str, record: dict[str, Any]) -> dict[str, Any]:
        """Give the shim a moment to record the incident bundle it is collecting, so the report names it."""
        deadline = time.monotonic() + self.BUNDLE_WAIT_S
        while time.monotonic() < deadline:
            latest = st.read_state(ctx.settings.state_dir, name) or {}
            if latest.get("bundle") or latest.get("bundle_note") or not st.shim_alive(latest, ctx.settings.proc_root):
                return {**record, **{k: v for k, v in latest.items() if k.startswith("bundle")}}
            time.sleep(0.1)
        return record


def program_problem(engine: EngineConfig, config_dir: Path) -> str | None:
    """Why the shim could not start `engine`'s program (missing, not executable), or None when it can.

    Looked up the way the shim runs it: a path (relative to the engine's workdir, else the config's
    directory), or a bare name on the PATH of the engine's environment.
    """
    program = engine.argv[0] if engine.argv else ""
    if not program:
        return "argv is empty"
    if "/" in program:
        where = Path(engine.workdir) if engine.workdir else config_dir
        path = where / program if not program.startswith("/") else Path(program)
        if not path.exists():
            return f"program {program} does not exist" + (f" (looked in {where})" if path != Path(program) else "")
        if path.is_dir() or not os.access(path, os.X_OK):
            return f"program {program} is not executable"
        return None
    search = engine.env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=search) is None:
        return f"program {program!r} is not on the PATH it runs with ({search})"
    return None


def select(config: NodeConfig, names: list[str]) -> tuple[EngineConfig, ...]:
    """The engines named (all when none), in config order; unknown names are an error."""
    if not names:
        return config.engines
    unknown = [n for n in names if config.engine(n) is None]
    if unknown:
        raise GpuwardenError(f"no engine named {', '.join(unknown)} in {config.path}",
                             f"the config has: {', '.join(e.name for e in config.engines) or 'none'}")
    return tuple(e for e in config.engines if e.name in names)
