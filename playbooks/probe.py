"""`arena probe`: run N canaries (one per GPU) with at most K registering at once, report how each fared, stop them.

A plain runner (it changes nothing on the node but its own temporary arena), reporting through a callback.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.foundation.paths import child_pythonpath
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.status_protocol import ENV_FILE, StatusFollower
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.arena import create, format as fmt
from gpuwarden.playbooks.probetrace import Trace
from gpuwarden.ops.node.sim import registrations
from gpuwarden.ops.node.debugfs.dyndbg import KfdLimitDebug
from gpuwarden.playbooks.nodecheck import snapshot
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.engines import state as engine_state

# Variables that narrow which GPUs a canary sees. ROCR_ acts at the ROCr level, so a HIP registration is
# mapped (and charged by KFD) for that one GPU only; HIP then numbers it 0.
OWN_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@dataclass
class CanaryRun:
    index: int
    gpu: int
    proc: subprocess.Popen
    status_path: Path
    log_path: Path
    follower: StatusFollower
    phase: str = "spawned"
    register_seconds: float | None = None
    gbps: float | None = None
    error: str | None = None
    ended: str | None = None
    returncode: int | None = None
    gate_wait_s: float | None = None
    phase_ts: dict[str, float] = field(default_factory=dict)
    pinned: bool = False  # sim replay: its pinned allocation after "serving" went through

    def to_dict(self) -> dict:
        return {"canary": self.index, "gpu": self.gpu, "pid": self.proc.pid, "phase": self.phase,
                "register_seconds": self.register_seconds, "gate_wait_seconds": self.gate_wait_s, "gbps": self.gbps, "ended": self.ended,
                "returncode": self.returncode, "error": self.error, "log": str(self.log_path)}


@dataclass
class ProbeOptions:
    engines: int
    concurrency: int
    runtime: str = "cuda"
    arena: str | None = None
    size: int | None = None
    verify: str = "header"
    register_chunk: str | None = None
    copy_buffer: str = "1GiB"
    visibility: str = "own"  # "own": each canary sees only its GPU; "all": every canary sees every GPU
    timeout_s: float = 600.0
    hold_s: float = 0.0
    workdir: str | None = None
    extra: tuple[str, ...] = ()  # more canary flags (fault switches for drills)
    trace: bool = False  # HIP/ROCr/thunk logging (and rocprofv3) around every canary: playbooks/probetrace.py
    pin_failure: str = "segv"  # sim: a canary whose pinned allocation fails dies of SIGSEGV ("segv") or reports it


SIM_ARENA_BYTES = 64 << 20  # the incident's 64 GiB arena, scaled down 1024 times for the simulated node
SIM_LIMIT_ENV = "GPUWARDEN_SIM_KFD_LIMIT"
# The incident's sequence on the simulated node, by default: every canary's registration fits, leaving 1/8 of an
# arena (the ledger near the limit); then each canary's next allocation, a pinned buffer of 1/4 arena, fails.
SIM_SLACK_DIVISOR = 8
SIM_PIN_DIVISOR = 4
_LIBRARIES = {"hip": "gpuwarden.ops.register.hip", "cuda": "gpuwarden.ops.register.cuda"}


def _require_runtime(runtime: str) -> None:
    """A runtime whose library is not installed fails here, in one line (exit 2), not once per canary."""
    module = _LIBRARIES.get(runtime)
    if module is not None:
        importlib.import_module(module)._import()  # RuntimeUnavailable names the library and how to get it


def _ended(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


class Probe:
    def __init__(self, settings: Settings, opts: ProbeOptions, say: Callable[[str], None] = lambda s: None):
        self.settings = settings
        self.o = opts
        self.say = say
        self.runs: list[CanaryRun] = []
        self.arena_path: str | None = None
        self.created_arena = False
        self._arena_bytes: int | None = None
        self.trace = None  # a probetrace.Trace with --trace
        self._already: list[dict] = []  # sim: live charges of other processes when the probe started
        self._replay = False  # sim: replaying the incident (a pinned allocation after each canary is up)
        self._dyndbg_notes: list[str] = []  # --trace: what was done with KFD's memory-limit debug message

    def run(self) -> dict:
        o = self.o
        if o.engines < 1 or o.concurrency < 1:
            raise GpuwardenError("--engines and --concurrency must be at least 1", "e.g. --engines 4 --concurrency 1")
        if o.arena is not None and o.size is not None:
            raise GpuwardenError("give one of --arena PATH and --size SIZE, not both", "e.g. --size 32GiB")
        if o.arena is None and o.size is None:
            if o.runtime != "sim":
                raise GpuwardenError("give --arena PATH (an arena to register) or --size SIZE (a temporary one)",
                                     "e.g. --size 32GiB; with --runtime sim the incident's scaled-down arena is "
                                     "the default")
            o.size = SIM_ARENA_BYTES
        _require_runtime(o.runtime)
        self._require_gpus()
        self._already = self._sim_already_charged() if o.runtime == "sim" else []
        work = Path(tempfile.mkdtemp(prefix="gpuwarden-probe-", dir=o.workdir))
        dyndbg = None
        if o.trace:
            self.trace = Trace(o.runtime, work)
            self.trace.dir.mkdir()
            if self.trace.plan()["note"]:
                self.say(f"trace: {self.trace.plan()['note']}")
            if o.runtime in ("hip", "sim"):
                dyndbg = KfdLimitDebug(self.settings.sysfs_root, self.settings.state_dir)
                self._dyndbg_notes = [dyndbg.enable()]
                self.say(self._dyndbg_notes[0])
        t0 = time.time()
        journal.write(self.settings.state_dir, "arena probe", "started", engines=o.engines,
                      concurrency=o.concurrency, runtime=o.runtime)
        try:
            self._arena(work)
            self._spawn(work)
            self._follow()
            if o.hold_s > 0:
                serving = sum(1 for r in self.runs if r.returncode is None)
                if serving == len(self.runs):
                    self.say(f"holding {o.hold_s:.0f}s with every canary serving")
                elif serving:
                    self.say(f"holding {o.hold_s:.0f}s with {serving} of {len(self.runs)} canaries serving")
                else:
                    self.say("no canary is serving: nothing to hold")
                if serving:
                    self._wait_hold()
            self._stop()
        except BaseException as exc:
            journal.write(self.settings.state_dir, "arena probe", "failed", error=str(exc) or type(exc).__name__)
            raise
        finally:
            for r in self.runs:
                if r.proc.poll() is None:
                    r.proc.kill()
                    r.proc.wait()
            if dyndbg is not None and (restored := dyndbg.restore()):
                self._dyndbg_notes.append(restored)
                self.say(restored)
            if self.created_arena and self.arena_path:
                Path(self.arena_path).unlink(missing_ok=True)
            shutil.rmtree(work / "gate", ignore_errors=True)
        ok = all(r.returncode == 0 and r.register_seconds is not None for r in self.runs)
        report = {
            "ok": ok, "engines": o.engines, "concurrency": o.concurrency, "runtime": o.runtime,
            "already_charged": self._already,
            "visibility": o.visibility, "arena": self.arena_path, "arena_bytes": self._arena_bytes,
            "seconds": round(time.time() - t0, 3), "workdir": str(work),
            "canaries": [r.to_dict() for r in self.runs],
        }
        if self.trace is not None:
            report["trace"] = self.trace.collect([r.log_path for r in self.runs])
            report["trace"]["kfd_debug"] = list(self._dyndbg_notes)
        journal.write(self.settings.state_dir, "arena probe", "ok" if ok else "failed",
                      engines=o.engines, concurrency=o.concurrency, runtime=o.runtime,
                      ended=[r.ended for r in self.runs])
        return report

    def _require_gpus(self) -> None:
        """Refuse canaries on GPUs the node lacks, in the words every other command uses (exit 2)."""
        have = self._gpu_indexes()
        if have is None:
            return  # host runtime, or a sim runtime with no sim node: no GPU is touched
        missing = [i for i in range(self.o.engines) if i not in have]
        if missing:
            shown = ", ".join(map(str, have)) or "none"
            raise NotFound(f"no GPU {missing[0]} on this node (GPUs: {shown})",
                           f"see `gpuwarden status` for the GPU indexes; --engines {self.o.engines} runs a canary on "
                           f"each of GPUs 0-{self.o.engines - 1}, so pass --engines {len(have)} or fewer")

    def _gpu_indexes(self) -> list[int] | None:
        if self.o.runtime == "host":
            return None
        if self.o.runtime == "sim":
            node = SimNode(self.settings.state_dir)
            return list(range(node.config()["gpus"])) if node.exists else None
        return [g.index for g in snapshot(self.settings).gpus]

    def _sim_already_charged(self) -> list[dict]:
        """Live charges in the simulated KFD ledger that are not this probe's: whose (engine name when one of the
        node's engines has that pid) and how much. The probe's limit leaves room for them and says so."""
        owners: dict[int, str] = {}
        for name in engine_state.names(self.settings.state_dir):
            record = engine_state.read_state(self.settings.state_dir, name) or {}
            if isinstance(record.get("pid"), int):
                owners[record["pid"]] = name
        by_pid: dict[int, dict] = {}
        for r in registrations.list_all(self.settings.state_dir):
            if r["stale"]:
                continue
            entry = by_pid.setdefault(r["pid"], {"pid": r["pid"], "engine": owners.get(r["pid"]), "bytes": 0})
            entry["bytes"] += r["bytes"]
        return sorted(by_pid.values(), key=lambda e: e["pid"])

    # Steps.
    def _arena(self, work: Path) -> None:
        if self.o.arena:
            self.arena_path = self.o.arena
            self._arena_bytes = fmt.load_header(self.o.arena).payload_size
            return
        assert self.o.size is not None
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() and shutil.disk_usage("/dev/shm").free > self.o.size * 1.1 else work
        path = base / f"gpuwarden-probe-{os.getpid()}.arena"
        self.say(f"creating a {fmt_bytes(self.o.size)} arena at {path}")
        made = create.create(path, size=self.o.size)
        self.created_arena = True
        self.arena_path = str(path)
        self._arena_bytes = made.header.payload_size
        self.say(f"created in {made.seconds:.1f}s")

    def _spawn(self, work: Path) -> None:
        o = self.o
        gate_dir = work / "gate"
        gate_dir.mkdir()
        for i in range(o.engines):
            status = work / f"canary-{i}.status"
            log = work / f"canary-{i}.log"
            env = {k: v for k, v in os.environ.items() if k not in ("GPUWARDEN_STATUS_FD",)}
            env = child_pythonpath(env)  # the canaries import this very gpuwarden, installed or not
            replay = self._replay = o.runtime == "sim" and not env.get(SIM_LIMIT_ENV)
            if replay:
                env[SIM_LIMIT_ENV] = f"{self._sim_limit()}B"
            env.update({ENV_FILE: str(status), "GPUWARDEN_GATE_DIR": str(gate_dir),
                        "GPUWARDEN_GATE_SLOTS": str(o.concurrency),
                        "GPUWARDEN_STATE_DIR": str(self.settings.state_dir)})
            if o.visibility == "own":
                for var in OWN_GPU_VARS:
                    env[var] = str(i)
                env.pop("HIP_VISIBLE_DEVICES", None)  # would index into ROCR_'s one GPU a second time
                gpu_arg = 0
            else:
                gpu_arg = i
            argv = [sys.executable, "-m", "gpuwarden.ops.canary", "--arena", str(self.arena_path), "--gpu", str(gpu_arg),
                    "--runtime", o.runtime, "--verify", o.verify, "--copy-buffer", o.copy_buffer, *o.extra]
            if o.register_chunk:
                argv += ["--register-chunk", o.register_chunk]
            if replay:
                assert self._arena_bytes is not None
                argv += ["--pin", f"{self._arena_bytes // SIM_PIN_DIVISOR}B", "--pin-after-peers", str(o.engines),
                         "--on-pin-failure", o.pin_failure]
            if self.trace is not None:
                env.update(self.trace.env())
                argv = self.trace.wrap(argv, i)
            with open(log, "wb") as logf:
                proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=str(work), start_new_session=True)
            self.runs.append(CanaryRun(i, i, proc, status, log, StatusFollower(status)))
        self.say(f"started {o.engines} canar{'y' if o.engines == 1 else 'ies'} ({o.runtime}), "
                 f"at most {o.concurrency} registering at once")
        if o.runtime == "sim" and not os.environ.get(SIM_LIMIT_ENV):
            assert self._arena_bytes is not None
            self.say(f"simulated KFD limit {fmt_bytes(self._sim_limit())}: all {o.engines} registrations fit, "
                     f"leaving {fmt_bytes(self._arena_bytes // SIM_SLACK_DIVISOR)}; each canary's next allocation, "
                     f"a {fmt_bytes(self._arena_bytes // SIM_PIN_DIVISOR)} pinned buffer, then fails, as on the "
                     f"incident's node ({SIM_LIMIT_ENV}=SIZE models another limit, registrations only)")
            if self._already:
                who = ", ".join(f"{e['engine'] or 'pid'} (pid {e['pid']}) {fmt_bytes(e['bytes'])}" for e in self._already)
                self.say(f"the simulated KFD ledger already holds {fmt_bytes(sum(e['bytes'] for e in self._already))} "
                         f"charged by {who}: the limit leaves room for them, so only this probe's canaries are "
                         f"measured (stop them, e.g. `gpuwarden sim scenario clean`, to start from an empty ledger)")

    def _sim_limit(self) -> int:
        """The simulated node's KFD system-memory limit when GPUWARDEN_SIM_KFD_LIMIT does not set one: what others
        already charged, plus every canary's registration (once per process, whatever GPUs it sees), plus 1/8 of an
        arena: the ledger ends near the limit, as on the incident's node, and the next pinned allocation fails."""
        assert self._arena_bytes is not None
        already = sum(e["bytes"] for e in getattr(self, "_already", []))
        return already + self.o.engines * self._arena_bytes + self._arena_bytes // SIM_SLACK_DIVISOR

    def _poll(self) -> None:
        for r in self.runs:
            for ev in r.follower.poll():
                r.phase = ev.phase
                r.phase_ts[ev.phase] = ev.ts
                if ev.phase == "registered":
                    r.register_seconds = ev.data.get("seconds")
                    if "registering" in r.phase_ts and r.register_seconds is not None:
                        r.gate_wait_s = round(max(0.0, ev.ts - r.phase_ts["registering"] - r.register_seconds), 3)
                    self.say(f"canary {r.index} (GPU {r.gpu}): registered {fmt_bytes(ev.data.get('bytes'))} "
                             f"in {r.register_seconds:.2f}s")
                elif ev.phase == "serving" and ev.data.get("pinned"):
                    r.pinned = True
                elif ev.phase == "serving":
                    r.gbps = ev.data.get("gbps")
                    if r.gbps is not None:
                        self.say(f"canary {r.index} (GPU {r.gpu}): copy {r.gbps:.1f} GB/s, serving")
                elif ev.phase == "exited" and ev.data.get("error"):
                    r.error = ev.data["error"]
            if r.returncode is None and r.proc.poll() is not None:
                r.returncode = r.proc.returncode
                r.ended = _ended(r.returncode)
                if r.phase not in ("exited",) or r.returncode != 0:
                    self.say(f"canary {r.index} (GPU {r.gpu}): ended ({r.ended}) in phase {r.phase}"
                             + (f": {r.error}" if r.error else ""))

    def _follow(self) -> None:
        deadline = time.monotonic() + self.o.timeout_s
        while True:
            self._poll()
            # In the sim replay a canary's next allocation follows "serving": wait for it as well.
            if all(r.returncode is not None or (r.phase == "serving" and (r.pinned or not self._replay))
                   for r in self.runs):
                return
            if time.monotonic() > deadline:
                self.say(f"timed out after {self.o.timeout_s:.0f}s waiting for every canary to serve")
                return
            time.sleep(0.05)

    def _wait_hold(self) -> None:
        end = time.monotonic() + self.o.hold_s
        while time.monotonic() < end and any(r.returncode is None for r in self.runs):
            self._poll()
            time.sleep(0.1)

    def _stop(self) -> None:
        # Our own children, not yet reaped: their pids cannot have been reused, so signalling is safe.
        for r in self.runs:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in self.runs):
            self._poll()
            time.sleep(0.05)
        for r in self.runs:
            if r.proc.poll() is None:
                self.say(f"canary {r.index} ignored SIGTERM for 60s: SIGKILL")
                r.proc.kill()
                r.proc.wait()
        self._poll()
        for r in self.runs:
            if r.error is None and r.returncode not in (0, None):
                r.error = _failed_call(r.log_path) or _last_line(r.log_path)


def _failed_call(path: Path) -> str | None:
    """The log's last failed runtime call ("hipHostMalloc of 16.0 MiB returned hipErrorOutOfMemory ..."): what a
    crash that follows it is about, said before the crash's own last words."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    hits = [ln for ln in lines if " returned hipError" in ln or " returned cudaError" in ln]
    return hits[-1][-300:] if hits else None


def _last_line(path: Path) -> str | None:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1][-300:] if lines else None


def table(report: dict) -> list[str]:
    rows = [f"{'canary':>6} {'gpu':>3} {'pid':>8} {'waited s':>8} {'register s':>10} {'GB/s':>7}  ended"]
    for c in report["canaries"]:
        reg = f"{c['register_seconds']:.2f}" if c["register_seconds"] is not None else "-"
        gbps = f"{c['gbps']:.1f}" if c["gbps"] is not None else "-"
        waited = f"{c['gate_wait_seconds']:.2f}" if c.get("gate_wait_seconds") is not None else "-"
        ended = c["ended"] or "-"
        if c["error"] and c["returncode"] != 0:
            ended += f"  ({c['error']})"
        rows.append(f"{c['canary']:>6} {c['gpu']:>3} {c['pid']:>8} {waited:>8} {reg:>10} {gbps:>7}  {ended}")
    verdict = "all canaries registered, served and stopped cleanly" if report["ok"] else "PROBLEMS: see the rows above"
    rows_ = report["canaries"]
    if not report["ok"] and rows_ and all(c["register_seconds"] is not None for c in rows_) \
            and any("hipHostMalloc" in (c["error"] or "") for c in rows_):
        verdict += ("; every registration succeeded, then the next pinned allocation failed: registrations and "
                    "pinned host memory share KFD's system-memory limit (`gpuwarden arena budget`)")
    rows.append(f"{report['engines']} canaries, concurrency {report['concurrency']}, runtime {report['runtime']}, "
                f"arena {fmt_bytes(report['arena_bytes'])}: {verdict}")
    return rows
