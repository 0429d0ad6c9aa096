"""Starting, stopping and restarting supervised engines: spec files, detached shims, checked signals.

Every signal re-checks its target's pid + start time right before it is sent, and leaves a journal line.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpuwarden.ops.foundation import journal, statedir
from gpuwarden.ops.node import nodestate, procs
from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound, Refused
from gpuwarden.ops.foundation.paths import child_pythonpath
from gpuwarden.ops.config.nodeconfig import EngineConfig, signal_number
from gpuwarden.ops.foundation.settings import Settings

from gpuwarden.ops.engines import state as st
from gpuwarden.ops.services.shim import ORIG_PYTHONPATH

VISIBILITY_VARS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def detect_vendor(settings: Settings) -> str:
    """"amd" when the node has a KFD device, else "nvidia" (the visibility variables differ)."""
    return "amd" if (settings.dev_root / "kfd").exists() else "nvidia"


def visibility_env(gpu: int | None, vendor: str) -> dict[str, str]:
    """Variables that make exactly GPU `gpu` visible to an engine.

    ROCm applies ROCR_VISIBLE_DEVICES first and HIP/CUDA_VISIBLE_DEVICES then index what is left
    (HIP's env-variable docs; PyTorch's _parse_visible_devices says the same), so on AMD the HIP
    and CUDA variables must say 0, not the physical index. On NVIDIA only CUDA_VISIBLE_DEVICES counts.
    """
    if gpu is None:
        return {}
    if vendor == "amd":
        return {"ROCR_VISIBLE_DEVICES": str(gpu), "HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"}
    return {"CUDA_VISIBLE_DEVICES": str(gpu), "HIP_VISIBLE_DEVICES": str(gpu), "ROCR_VISIBLE_DEVICES": str(gpu)}


def expand(engine: EngineConfig) -> EngineConfig:
    """Fill the placeholders {name} and {gpu} in argv (nothing else is interpreted)."""
    gpu = "" if engine.gpu is None else str(engine.gpu)
    argv = tuple(a.replace("{name}", engine.name).replace("{gpu}", gpu) for a in engine.argv)
    return dataclasses.replace(engine, argv=argv)


def gate_dir(settings: Settings) -> Path:
    return settings.state_dir.resolve() / statedir.GATE


def write_spec(settings: Settings, engine: EngineConfig, *, gate_slots: int, registration_timeout: float,
               workdir: str | None, launch_id: str, vendor: str | None = None) -> dict[str, Any]:
    spec = {
        "engine": expand(engine).to_dict(),
        "gate_dir": str(gate_dir(settings)),
        "gate_slots": gate_slots,
        "registration_timeout": registration_timeout,
        "workdir": engine.workdir or workdir,
        "visibility": visibility_env(engine.gpu, vendor or detect_vendor(settings)),
        "launch_id": launch_id,
        "written_at": time.time(),
    }
    d = statedir.ensure(settings.state_dir, statedir.ENGINES, engine.name)
    # The one place the engine's real argv and env are kept (the shim runs them): mode 0600, never printed.
    statedir.write_json(d / st.SPEC, spec, 0o600, root=settings.state_dir)
    return spec


def new_launch_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def spawn_shim(settings: Settings, name: str) -> int:
    """Start the detached shim of engine `name` (its spec must exist) and return the shim's pid."""
    return _shim_pid(settings, name, _fork_shim(settings, name))


def _fork_shim(settings: Settings, name: str) -> subprocess.Popen[bytes]:
    """Fork the shim of `name` into its own session. From here on it runs whatever becomes of the caller."""
    state_dir = settings.state_dir.resolve()
    env = dict(os.environ)
    env[ORIG_PYTHONPATH] = env.get("PYTHONPATH", "")
    env = child_pythonpath(env)  # the shim must import this very gpuwarden; it restores ORIG_PYTHONPATH
    with statedir.open_dir(state_dir, statedir.ENGINES, name) as folder:
        # The old state would be read as this run's until the shim writes its own.
        folder.unlink(st.STATE)
        shim_log = folder.open(st.SHIM_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "gpuwarden.ops.services.shim", "--name", name, "--state-dir", str(state_dir), "--detach"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=shim_log, cwd="/", env=env,
            start_new_session=True, close_fds=True,
        )
    finally:
        os.close(shim_log)


def _shim_pid(settings: Settings, name: str, proc: subprocess.Popen[bytes]) -> int:
    """The supervising pid the detaching shim prints (it forks once more before printing it)."""
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    proc.stdout.close()
    proc.wait()
    if not line.isdigit():
        raise GpuwardenError(f"the shim for engine {name!r} did not start "
                             f"(see {st.engine_dir(settings.state_dir, name) / st.SHIM_LOG})",
                             "run `python -m gpuwarden.ops.services.shim --help` to check the installation")
    return int(line)


def supervised(settings: Settings, name: str) -> bool:
    """True while a live shim looks after `name`."""
    record = st.read_state(settings.state_dir, name)
    if not record:
        return False
    return st.shim_alive(record, settings.proc_root) and record.get("phase") not in st.FINAL_PHASES


def start(settings: Settings, engine: EngineConfig, *, gate_slots: int, registration_timeout: float,
          workdir: str | None, launch_id: str | None = None) -> int:
    """Write the spec and start the shim; refuse when a live shim already supervises that name."""
    return start_all(settings, (engine,), gate_slots=gate_slots, registration_timeout=registration_timeout,
                     workdir=workdir, launch_id=launch_id)[engine.name]


def start_all(settings: Settings, engines: tuple[EngineConfig, ...] | list[EngineConfig], *, gate_slots: int,
              registration_timeout: float, workdir: str | None, launch_id: str | None = None) -> dict[str, int]:
    """Start the shims of several engines at once; returns name -> shim pid.

    Every spec is written and every shim forked before any is waited for: a launcher that dies (a dropped
    SSH session) once the first engine serves has then already started them all, not just the first few.
    """
    for engine in engines:
        if supervised(settings, engine.name):
            raise Refused(f"engine {engine.name!r} is already running under its shim",
                          f"stop it first: `gpuwarden engines stop {engine.name}`")
    launch_id = launch_id or new_launch_id()
    for engine in engines:
        write_spec(settings, engine, gate_slots=gate_slots, registration_timeout=registration_timeout,
                   workdir=workdir, launch_id=launch_id)
    forked = [(engine, _fork_shim(settings, engine.name)) for engine in engines]
    pids: dict[str, int] = {}
    failure: GpuwardenError | None = None
    for engine, proc in forked:
        try:
            pids[engine.name] = _shim_pid(settings, engine.name, proc)
        except GpuwardenError as exc:
            failure = failure or exc
            continue
        journal.write(settings.state_dir, "engine-start", "started", engine=engine.name, gpu=engine.gpu,
                      shim_pid=pids[engine.name], launch_id=launch_id, argv=list(engine.argv))
    if failure is not None:
        raise failure
    return pids


@dataclass(frozen=True)
class StopResult:
    name: str
    result: str  # "stopped", "not-running", "killed"
    detail: str = ""


def _signal_checked(settings: Settings, name: str, pid: int, start: int | None, sig: int, role: str) -> bool:
    """Send `sig` only if pid is still the same process; journal what was done. True when sent."""
    if not st.alive(pid, start, settings.proc_root):
        journal.write(settings.state_dir, "engine-signal", "skipped", engine=name, pid=pid, role=role,
                      signal=signal.Signals(sig).name, reason="process gone or pid reused")
        return False
    if not _send(os.kill, pid, sig, f"{role} pid {pid}", name):
        return False
    journal.write(settings.state_dir, "engine-signal", "ok", engine=name, pid=pid, role=role,
                  signal=signal.Signals(sig).name)
    return True


def _send(send: Callable[[int, int], None], target: int, sig: int, what: str, name: str) -> bool:
    """os.kill or os.killpg; False when the target is gone, Refused without the permission."""
    try:
        send(target, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        raise Refused(f"no permission to signal {what} of engine {name!r}",
                      "run as the user who launched it, or as root") from None
    return True


def _group_left(settings: Settings, pgid: int, start: int | None) -> list[int]:
    """Live members of the engine's process group that started no earlier than the engine itself
    (a group id outlives its leader; a process older than the engine cannot be one of its children)."""
    out = []
    for pid in procs.group_members(pgid, settings.proc_root):
        ticks = procs.identity(pid, settings.proc_root)
        if ticks is not None and start is not None and ticks >= start \
                and procs.state_of(pid, settings.proc_root) not in ("zombie", "gone"):
            out.append(pid)
    return out


def _signal_group_checked(settings: Settings, name: str, pid: int, start: int | None, sig: int) -> bool:
    """Signal the engine's process group (the shim started it as a group leader), after the same checks
    as one process: the leader is still the engine first recorded, or, once it is gone, what is left
    of its group started after it. Journals what was done. True when sent."""
    leader = st.alive(pid, start, settings.proc_root)
    members = _group_left(settings, pid, start)
    try:
        leads = leader and os.getpgid(pid) == pid
    except ProcessLookupError:
        leads = False
    if not (leads or (not leader and members)):
        if leader:  # it left the group it was started in: signal it alone
            return _signal_checked(settings, name, pid, start, sig, "engine")
        return False
    if not _send(os.killpg, pid, sig, f"the process group {pid}", name):
        return False
    journal.write(settings.state_dir, "engine-signal", "ok", engine=name, pgid=pid, role="engine group",
                  pids=([pid] if leader else []) + [m for m in members if m != pid][:20],
                  signal=signal.Signals(sig).name)
    return True


def _wait_gone(settings: Settings, pid: int | None, start: int | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not st.alive(pid, start, settings.proc_root):
            return True
        time.sleep(0.05)
    return not st.alive(pid, start, settings.proc_root)


def _wait_group_gone(settings: Settings, pid: int, start: int | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not st.alive(pid, start, settings.proc_root) and not _group_left(settings, pid, start):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop(settings: Settings, name: str, *, timeout_s: float | None = None) -> StopResult:
    """Stop one engine: through its shim (stop signal, grace, SIGKILL), or directly when the shim is gone."""
    record = st.read_state(settings.state_dir, name)
    spec = st.read_spec(settings.state_dir, name)
    if record is None and spec is None:
        raise NotFound(f"no engine named {name!r} in {settings.state_dir}",
                       "see `gpuwarden engines list` for the names")
    record = record or {}
    engine = EngineConfig.from_dict((spec or {}).get("engine", {"name": name, "argv": ["?"]}))
    grace = engine.stop_grace if timeout_s is None else timeout_s
    shim_pid, shim_start = record.get("shim_pid"), record.get("shim_start")
    pid, pid_start = record.get("pid"), record.get("pid_start")
    ended = record.get("phase") in st.FINAL_PHASES and not st.alive(pid, pid_start, settings.proc_root)
    if shim_pid and st.shim_alive(record, settings.proc_root) and not ended:  # shim_alive is False without a pid
        # (A shim whose engine has ended is only finishing its records, e.g. a crash bundle: leave it be.)
        _signal_checked(settings, name, shim_pid, shim_start, signal.SIGTERM, "shim")
        # The shim itself sends SIGKILL after the grace; give it that plus a margin to record the exit.
        if _wait_gone(settings, shim_pid, shim_start, grace + 5.0):
            after = st.read_state(settings.state_dir, name) or {}
            journal.write(settings.state_dir, "engine-stop", "ok", engine=name, via="shim",
                          signal=after.get("signal"), exit_code=after.get("exit_code"))
            return StopResult(name, "stopped", after.get("detail", ""))
        # A wedged shim: take both down ourselves.
        _signal_group_checked(settings, name, pid, pid_start, signal.SIGKILL) if pid else None
        _signal_checked(settings, name, shim_pid, shim_start, signal.SIGKILL, "shim")
        journal.write(settings.state_dir, "engine-stop", "killed", engine=name, reason="shim did not finish")
        return StopResult(name, "killed", "the shim did not finish in time; engine and shim were SIGKILLed")
    if pid and (st.alive(pid, pid_start, settings.proc_root) or _group_left(settings, pid, pid_start)):
        # Shim gone, engine (or what it started) still there: do the shim's job with the same checks.
        _signal_group_checked(settings, name, pid, pid_start, signal_number(engine.stop_signal))
        how = "stopped"
        if not _wait_group_gone(settings, pid, pid_start, grace):
            _signal_group_checked(settings, name, pid, pid_start, signal.SIGKILL)
            _wait_group_gone(settings, pid, pid_start, 5.0)
            how = "killed"
        statedir.write_json(st.engine_dir(settings.state_dir, name) / st.STATE, {
            **record, "phase": "exited", "stopped_by_request": True, "updated_at": time.time(),
            "detail": f"{how} by gpuwarden after its shim was gone"}, root=settings.state_dir)
        journal.write(settings.state_dir, "engine-stop", "ok", engine=name, via="direct", how=how)
        return StopResult(name, how, "its shim was gone; signalled the engine directly")
    journal.write(settings.state_dir, "engine-stop", "skipped", engine=name, reason="not running")
    return StopResult(name, "not-running", "neither the engine nor its shim is running")


def stop_gpu(settings: Settings, gpu: int, *, timeout_s: float | None = None) -> list[StopResult]:
    """Stop every supervised engine on GPU `gpu` (the drain playbook's step)."""
    out = []
    for info in st.list_engines(settings):
        if info.gpu == gpu and info.phase not in st.FINAL_PHASES:
            out.append(stop(settings, info.name, timeout_s=timeout_s))
    return out


def restart(settings: Settings, name: str, *, timeout_s: float | None = None) -> int:
    """Stop `name` if it runs, then start it again from its recorded spec; returns the new shim pid."""
    spec = st.read_spec(settings.state_dir, name)
    if spec is None:
        raise NotFound(f"no engine named {name!r} in {settings.state_dir}",
                       "launch it first: gpuwarden launch NAME")
    gpu = (spec.get("engine") or {}).get("gpu")
    if gpu is not None and int(gpu) in nodestate.drained(settings.state_dir):
        # launch refuses a drained GPU; a restart must not slip an engine back onto it
        raise Refused(f"GPU {gpu} (engine {name}) is drained; the engine was left as it is",
                      f"undrain it first (gpuwarden undrain {gpu}) if it is back in service")
    stop(settings, name, timeout_s=timeout_s)
    shim_pid = spawn_shim(settings, name)
    journal.write(settings.state_dir, "engine-restart", "started", engine=name, shim_pid=shim_pid)
    return shim_pid


def wait_for_record(settings: Settings, name: str, shim_pid: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """Wait until the new shim has written its first state; raise with its log when it died first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = st.read_state(settings.state_dir, name)
        if record and record.get("shim_pid") == shim_pid:
            return record
        if procs.state_of(shim_pid, settings.proc_root) in ("gone", "zombie", "dead"):
            break
        time.sleep(0.02)
    lines = st.tail(st.engine_dir(settings.state_dir, name) / st.SHIM_LOG, 5)
    raise GpuwardenError(f"the shim for engine {name!r} exited before reporting: " + (" | ".join(lines) or "no output"),
                         f"see {st.engine_dir(settings.state_dir, name) / st.SHIM_LOG}")
