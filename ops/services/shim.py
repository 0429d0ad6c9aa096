"""The shim: a detached supervisor for one engine (like conmon): starts it, logs it, follows and records it.

Run as `python -m gpuwarden.ops.services.shim --name NAME --state-dir DIR`; reads spec.json, is the only writer of state.json.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuwarden.ops.foundation import gate, journal, statedir
from gpuwarden.ops.node import procs
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import FAILED_REGISTRATION
from gpuwarden.ops.config.nodeconfig import EngineConfig, signal_number
from gpuwarden.ops.foundation.status_protocol import ENV_FILE, StatusFollower
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.foundation.waitfd import readable

from gpuwarden.ops.engines import preload, runtime_errors
from gpuwarden.ops.engines import state as st
from gpuwarden.ops.engines.logs import CappedLog
from gpuwarden.ops.engines.progress import Progress
from gpuwarden.ops.engines.ledger import HostLedgerLog
from gpuwarden.ops.engines.ledger import PHASES as HOST_PHASES
from gpuwarden.ops.engines.registrations import RegistrationLog
from gpuwarden.ops.foundation.paths import ORIG_PYTHONPATH

POLL_S = 0.05
# The automatic bundle (gpuwarden.ops.bundle.auto) collects in safe mode within seconds; past this it is abandoned.
AUTO_BUNDLE_DEADLINE_S = 120.0


class Shim:
    def __init__(self, state_dir: Path, name: str):
        self.state_dir = state_dir
        self.name = name
        self.dir = st.engine_dir(state_dir, name)
        spec = st.read_spec(state_dir, name)
        if spec is None:
            raise GpuwardenError(f"no spec.json for engine {name!r} in {self.dir}")
        self.spec = spec
        self.engine = EngineConfig.from_dict(spec["engine"])
        self.stop_requested = False
        self.record: dict[str, Any] = {
            "name": name, "gpu": self.engine.gpu, "phase": "starting", "detail": "",
            "shim_pid": os.getpid(), "shim_start": procs.identity(os.getpid()),
            "pid": None, "pid_start": None, "started_at": None, "exit_code": None, "signal": None,
            "core_dumped": None, "restarts": 0, "bundle": None, "phases": {}, "launch_id": spec.get("launch_id"),
            "gate_slot": None, "stopped_by_request": False, "registrations": [], "updated_at": time.time(),
        }
        self.registrations = RegistrationLog()
        self.host_ledger = HostLedgerLog()
        self._ledger_saved_at = 0.0  # monotonic; the ledger's totals are saved at most once a second
        self._ledger_dirty = False
        self._bundle_threads: list[threading.Thread] = []
        self._save_lock = threading.Lock()

    # --- recording ---------------------------------------------------------------------------

    def save(self, **changes: Any) -> None:
        # The bundle thread saves too; one writer at a time keeps the record whole.
        with self._save_lock:
            self.record.update(changes)
            self.record["updated_at"] = time.time()
            statedir.write_json(self.dir / st.STATE, self.record, root=self.state_dir)

    def on_stop_signal(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    # --- the supervision loop ----------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_stop_signal)
        signal.signal(signal.SIGINT, self.on_stop_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a dropped SSH session must not end supervision
        # A fresh launch starts a fresh status file, so its timestamps describe this launch only.
        statedir.atomic_write(self.dir / st.STATUS, b"", root=self.state_dir)
        self.save()
        starts: collections.deque[float] = collections.deque()
        failures = 0
        while not self.stop_requested:
            now = time.monotonic()
            while starts and now - starts[0] > self.engine.start_limit_interval:
                starts.popleft()
            if len(starts) >= self.engine.start_limit_burst:
                self.save(detail=f"start limit hit: {len(starts)} starts within "
                          f"{self.engine.start_limit_interval:.0f}s; not restarting")
                break
            if failures:
                self.record["restarts"] += 1
            starts.append(now)
            outcome = self.run_once()
            if outcome != "crashed" or self.engine.restart != "on-failure" or self.stop_requested:
                break
            failures += 1
            delay = min(self.engine.restart_backoff * (2 ** (failures - 1)), self.engine.restart_backoff_max)
            self.save(detail=f"restarting in {delay:.1f}s (restart policy on-failure)")
            if self._sleep(delay):
                break
        for t in self._bundle_threads:
            t.join(timeout=180)
        self.save()
        return 0

    def _sleep(self, seconds: float) -> bool:
        """Sleep, waking early on a stop request; True when stopped."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.stop_requested:
                return True
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        return self.stop_requested

    def engine_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if ORIG_PYTHONPATH in env:
            orig = env.pop(ORIG_PYTHONPATH)
            if orig:
                env["PYTHONPATH"] = orig
            else:
                env.pop("PYTHONPATH", None)
        env.update(self.spec.get("visibility", {}))
        env[ENV_FILE] = str(self.dir / st.STATUS)
        if self.engine.gated and self.engine.progress in ("status", "preload"):
            env[gate.ENV_DIR] = self.spec["gate_dir"]
            env[gate.ENV_SLOTS] = str(self.spec["gate_slots"])
        env["GPUWARDEN_ENGINE"] = self.name
        env.update(self.engine.env)
        if self.engine.progress == "preload":
            env.update(preload.engine_env(self.engine, env, self.dir / preload.READY_FILE, self._registration_timeout()))
        return env

    def _registration_timeout(self) -> float:
        return float(self.spec.get("registration_timeout", 600))

    def take_slot(self) -> gate.Slot | None:
        """For engines that cannot take the gate themselves: hold a slot from spawn to registered."""
        if not (self.engine.gated and self.engine.progress == "log"):
            return None
        self.save(phase="waiting", detail="waiting for a registration slot")
        while not self.stop_requested:
            try:
                slot = gate.acquire(Path(self.spec["gate_dir"]), int(self.spec["gate_slots"]),
                                    who=f"shim:{self.name}", timeout_s=0.2)
            except gate.GateTimeout:
                continue
            self.save(gate_slot=slot.index, detail="")
            return slot
        return None

    def run_once(self) -> str:
        """Start the engine once and supervise it to its end: 'stopped', 'exited' or 'crashed'."""
        self.save(pid=None, pid_start=None, exit_code=None, signal=None, core_dumped=None, phases={},
                  stopped_by_request=False, phase="starting", detail="", warning=None)
        slot = self.take_slot()
        if self.stop_requested:
            self.save(phase="exited", detail="stopped before it started", stopped_by_request=True)
            return "stopped"
        status = StatusFollower(self.dir / st.STATUS)
        # Skip what earlier runs wrote; a restart must not replay their phases.
        try:
            status._offset = (self.dir / st.STATUS).stat().st_size
        except FileNotFoundError:
            pass
        log = CappedLog(self.dir / st.LOG, self.engine.log_max)
        preloaded = self.engine.progress == "preload"
        # With the interposer, its events say when the engine registered; only ready_pattern is read.
        progress = Progress(None if preloaded else self.engine.registered_pattern, self.engine.ready_pattern,
                            serving_when_registered=preloaded and not self.engine.ready_pattern)
        try:
            (self.dir / preload.READY_FILE).unlink()
        except FileNotFoundError:
            pass
        log.write(f"{st.RUN_MARK}starting {self.name} (restart {self.record['restarts']}) at "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n".encode())
        try:
            proc = subprocess.Popen(
                list(self.engine.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, cwd=self.spec.get("workdir") or None, env=self.engine_env(),
                process_group=0,
            )
        except (OSError, GpuwardenError) as exc:
            why = exc.message if isinstance(exc, GpuwardenError) else (exc.strerror or str(exc))
            log.write(f"gpuwarden shim: cannot start {self.engine.argv[0]!r}: {why}\n".encode())
            log.close()
            if slot:
                slot.release()
            self.save(phase="crashed", detail=f"cannot start {self.engine.argv[0]!r}: {why}", gate_slot=None)
            return "crashed"
        self.host_ledger.new_run(time.time())
        self.save(pid=proc.pid, pid_start=procs.identity(proc.pid), started_at=time.time(),
                  phases={"starting": time.time()}, host_ledger=self.host_ledger.record)
        try:
            return self._supervise(proc, log, status, progress, slot)
        finally:
            log.close()
            if slot:
                slot.release()

    def _supervise(self, proc: subprocess.Popen[bytes], log: CappedLog, status: StatusFollower,
                   progress: Progress, slot: gate.Slot | None) -> str:
        assert proc.stdout is not None
        ready_file = self.dir / preload.READY_FILE if self.engine.progress == "preload" else None
        preloaded = False  # the interposer's first event arrived from this run
        out_fd = proc.stdout.fileno()
        os.set_blocking(out_fd, False)
        partial = b""
        spawned = time.monotonic()
        stop_sig = signal_number(self.engine.stop_signal)
        kill_at: float | None = None
        pipe_open = True
        exited = False
        while True:
            changed = False
            if pipe_open:
                if readable(out_fd, POLL_S):
                    try:
                        chunk = os.read(out_fd, 65536)
                    except BlockingIOError:
                        chunk = None
                    if chunk == b"":
                        pipe_open = False
                    elif chunk:
                        log.write(chunk)
                        partial += chunk
                        *lines, partial = partial.split(b"\n")
                        for raw in lines:
                            changed |= progress.on_line(raw.decode(errors="replace"))
                        if len(partial) > 65536:
                            partial = partial[-4096:]
            else:
                time.sleep(POLL_S)
            for event in status.poll():
                changed |= progress.on_event(event)
                self._on_registration(event)
                preloaded |= event.phase == "preloaded"
            self._save_host_ledger()
            self._check_hung()
            if ready_file is not None and progress.phase == "serving" and not preloaded:
                self.save(warning="the interposer did not load in this engine (a static or setuid program?): "
                          "its registrations were not gated; use progress = \"log\" for it")
                preloaded = True  # said once
            if changed and kill_at is None:
                self.save(phase=progress.phase, phases=dict(progress.since))
            if slot is not None and slot.fd >= 0:
                if self._release_due(progress):
                    slot.release()
                    self.save(gate_slot=None)
                elif time.monotonic() - spawned > self._registration_timeout():
                    slot.release()
                    self.save(gate_slot=None, detail="registration timeout: released the gate slot "
                              "without seeing registered_pattern")
            if ready_file is not None and progress.phase == "serving":
                ready_file.touch()  # the interposer in the engine holds its slot until this appears
                ready_file = None
            if self.stop_requested and kill_at is None:
                self.save(phase="stopping", stopped_by_request=True,
                          detail=f"sent {self.engine.stop_signal}, SIGKILL after {self.engine.stop_grace:.0f}s")
                # The whole process group, so a `sh -c` engine's children stop with it. The engine is our
                # unreaped child and leads that group, so neither id can have been reused yet.
                _signal_group(proc.pid, stop_sig)
                kill_at = time.monotonic() + self.engine.stop_grace
            if not exited:
                # WNOWAIT: the engine stays an unreaped zombie until its leftovers are dealt with below,
                # so its pid, which is also its process group's id, cannot name another process meanwhile.
                exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            if kill_at is not None and time.monotonic() >= kill_at and not exited:
                _killpg(proc.pid)
                self.save(detail=f"no exit within {self.engine.stop_grace:.0f}s of {self.engine.stop_signal}: "
                          "sent SIGKILL")
                kill_at = float("inf")
            if exited:
                break
        tail = partial + self._drain(out_fd, log, pipe_open)
        # The engine may have said its last phase just before dying, after our last look: read it,
        # so the record says what it died while doing.
        for raw in tail.split(b"\n"):
            if raw:
                progress.on_line(raw.decode(errors="replace"))
        for event in status.poll():
            progress.on_event(event)
            self._on_registration(event)
        self._save_host_ledger(now=True)
        if self.registrations.died(time.time()):
            self.save(registrations=self.registrations.records)
        # Leftover children of the engine keep GPU memory; they go with it. After a stop request they got
        # the stop signal too: they may use what is left of the grace to finish.
        left = self._leftovers(proc.pid)
        if left and kill_at is not None:
            until = min(kill_at, time.monotonic() + 5.0)
            while left and time.monotonic() < until:
                time.sleep(POLL_S)
                left = self._leftovers(proc.pid)
        if left:
            _killpg(proc.pid)
            journal.write(self.state_dir, "engine-leftovers", "killed", engine=self.name, pgid=proc.pid,
                          pids=left[:20], why="still in the exited engine's process group")
        # We reap the engine ourselves: Popen's returncode drops the core-dump bit of the wait status.
        _, wait_status = os.waitpid(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        return self.record_exit(wait_status, progress)

    def _release_due(self, progress: Progress) -> bool:
        """For log engines: has the moment come to give back the slot the shim holds for them?"""
        release = self.engine.gate_release
        if release == "ready":
            return progress.phase == "serving"
        if not progress.registered:
            return False
        after = preload.release_after_s(release)
        registered_at = progress.since.get("registered", progress.since.get("serving", time.time()))
        return after is None or time.time() - registered_at >= after

    def _on_host_call(self, event: Any) -> None:
        """A pinned host allocation or free (the KFD ledger). A failed one is saved at once, said in the record and the
        journal; the others only move the totals, saved with the next (at most one a second: an engine may pin and
        free hundreds of buffers a second, each with a line)."""
        got = self.host_ledger.on_event(event)
        if got is None:
            return
        self._ledger_dirty = True
        if not event.phase.endswith("-failed"):
            return
        error = runtime_errors.describe(got.get("call"), got.get("result"))
        detail = (f"{got.get('call') or 'pinned host call'} of {fmt_bytes(got.get('bytes'))} returned {error}"
                  + (": the runtime refused pinned host memory; KFD charges it against the same system-memory limit "
                     "as registrations (amdgpu_amdkfd_reserve_mem_limit): `gpuwarden engines list` shows whether the "
                     "charges near that limit" if event.phase == "host-alloc-failed" else ""))
        journal.write(self.state_dir, "engine-host-call-failed", "failed", engine=self.name, pid=got.get("pid"),
                      call=got.get("call"), bytes=got.get("bytes"), flags=got.get("flags"),
                      code=got.get("result"), error=runtime_errors.name(got.get("call"), got.get("result")))
        self._save_host_ledger(now=True, detail=detail)

    def _save_host_ledger(self, now: bool = False, **changes: Any) -> None:
        if not self._ledger_dirty or (not now and time.monotonic() - self._ledger_saved_at < 1.0):
            return
        self._ledger_dirty = False
        self._ledger_saved_at = time.monotonic()
        self.save(host_ledger=self.host_ledger.record, **changes)

    def _on_registration(self, event: Any) -> None:
        if event.phase in HOST_PHASES:
            self._on_host_call(event)
            return
        if event.phase == "preload-warning":
            self.save(warning=f"interposer: {event.data.get('message')}")
            return
        record = self.registrations.on_event(event)
        if record is None:
            return
        changes: dict[str, Any] = {"registrations": self.registrations.records}
        what = f"{record.get('call') or 'registration'} of {fmt_bytes(record.get('bytes'))}"
        if event.phase in ("register-failed", "unregister-failed"):
            error = runtime_errors.describe(record.get("call"), record.get("result"))
            changes["detail"] = f"{what} returned {error} after {record['seconds'] or 0:.3f}s"
            if event.phase == "register-failed":
                changes["detail"] += ": the engine goes on without that memory registered"
                journal.write(self.state_dir, "engine-register-failed", "failed", engine=self.name,
                              pid=record.get("pid"), call=record.get("call"), bytes=record.get("bytes"),
                              code=record.get("result"), error=runtime_errors.name(record.get("call"),
                                                                                     record.get("result")))
        elif event.phase == "registered" and self.record.get("phase") == FAILED_REGISTRATION:
            changes["detail"] = f"{what} registered after an earlier registration failed"
        elif event.phase == "register-hung":
            changes["detail"] = (f"{what} hung: still running after {record['seconds'] or 0:.0f}s (registration "
                                 "timeout); its gate slot was let go so the other engines go on")
            journal.write(self.state_dir, "engine-register-hung", "hung", engine=self.name, pid=record.get("pid"),
                          call=record.get("call"), bytes=record.get("bytes"), seconds=record.get("seconds"))
        self.save(**changes)

    def _check_hung(self) -> None:
        """A registration the interposer never finished or reported hung (its watchdog could not run)."""
        limit = self._registration_timeout() + 5.0
        now = time.time()
        for record in self.registrations.running():
            if record["outcome"] == "running" and record["started_at"] and now - record["started_at"] > limit:
                record["outcome"], record["seconds"] = "hung", now - record["started_at"]
                self.save(registrations=self.registrations.records,
                          detail=f"{record.get('call') or 'registration'} of {fmt_bytes(record.get('bytes'))} "
                                 f"has not returned after {now - record['started_at']:.0f}s")

    @staticmethod
    def _leftovers(pgid: int) -> list[int]:
        return [p for p in procs.group_members(pgid) if p != pgid and procs.state_of(p) not in ("zombie", "gone")]

    def _drain(self, fd: int, log: CappedLog, pipe_open: bool) -> bytes:
        # Read what the engine wrote just before dying; a grandchild holding the pipe must not stall us.
        got = b""
        deadline = time.monotonic() + 0.5
        while pipe_open and time.monotonic() < deadline:
            if not readable(fd, 0.05):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            log.write(chunk)
            got += chunk
        return got

    def record_exit(self, raw: int, progress: Progress) -> str:
        code, sig, core = None, None, None
        if os.WIFSIGNALED(raw):
            sig, core = _signal_name(os.WTERMSIG(raw)), bool(os.WCOREDUMP(raw))
        else:
            code = os.waitstatus_to_exitcode(raw)
        requested = self.record.get("stopped_by_request")
        ours = (self.engine.stop_signal, "SIGKILL")
        # After our stop request, only death by a signal we did not send counts as a crash.
        crashed = (sig is not None and sig not in ours) if requested else (sig is not None or code != 0)
        phases = dict(progress.since)
        phases["crashed" if crashed else "exited"] = time.time()
        if sig:
            how = f"killed by {sig}" + (" (core dumped)" if core else "")
        else:
            how = f"exited with code {code}"
        was = progress.phase
        crashes = dict(self.record.get("crashes") or {})
        if crashed:
            # Per signal, over the shim's life (restarts included): the metrics' crashes_total{signal}.
            crashes[sig or "none"] = crashes.get(sig or "none", 0) + 1
        # Journal first: whoever sees the final phase in state.json finds the journal line too.
        journal.write(self.state_dir, "engine-exit", "crashed" if crashed else "ok", engine=self.name,
                      pid=self.record.get("pid"), exit_code=code, signal=sig, core_dumped=core, phase=was,
                      requested=bool(requested))
        while_ = "after its registration failed" if was == FAILED_REGISTRATION else f"while {was}"
        self.save(phase="crashed" if crashed else "exited", exit_code=code, signal=sig, core_dumped=core,
                  phases=phases, gate_slot=None, detail=f"{how} {while_}" if crashed else how,
                  died_while=was, crashes=crashes)
        if crashed and sig:
            self._collect_bundle(f"engine {self.name} {how} {while_}")
        return "crashed" if crashed else ("stopped" if requested else "exited")

    def _collect_bundle(self, reason: str) -> None:
        def work() -> None:
            try:
                # A child process: the bundle machinery sits above engines, and a collector that misbehaves
                # can take only that child down, never the shim that supervises the engine.
                done = subprocess.run(
                    [sys.executable, "-m", "gpuwarden.ops.bundle.auto", "--state-dir", str(self.state_dir),
                     "--engine", self.name, "--reason", reason],
                    stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=AUTO_BUNDLE_DEADLINE_S)
                path = done.stdout.strip()
                if done.returncode != 0:
                    raise RuntimeError(done.stderr.strip()[-300:] or f"exit code {done.returncode}")
                if path:
                    self.save(bundle=str(path))
                else:
                    self.save(bundle_note="no new bundle: one was collected minutes ago (see `gpuwarden journal`)")
            except Exception as exc:  # supervision must never fail because evidence could not be gathered
                print(f"gpuwarden shim: bundle collection failed: {exc!r}", file=sys.stderr)
                self.save(bundle_note=f"bundle collection failed: {exc}")
        t = threading.Thread(target=work, name="bundle", daemon=True)
        t.start()
        self._bundle_threads.append(t)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuwarden.ops.services.shim", description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--detach", action="store_true",
                        help="fork once more, print the supervising pid, and let the caller go")
    args = parser.parse_args(argv)
    if args.detach:
        # Second fork of a double fork: the session leader exits, so the shim can never regain a
        # terminal, and the launcher reaps its direct child at once instead of leaving a zombie.
        pid = os.fork()
        if pid:
            print(pid, flush=True)
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 1)
        os.close(devnull)
    try:
        return Shim(args.state_dir, args.name).run()
    except GpuwardenError as exc:
        print(f"gpuwarden shim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
