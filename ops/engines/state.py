"""Engine state as the shims recorded it: the files under <state dir>/engines/<name>/, and reading them.

list_engines() feeds the snapshot; a record whose shim is gone is reported stale, never trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.node import procs
from gpuwarden.ops.foundation import redact, statedir, statefiles
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import EngineInfo, Registration, host_ledger_from
from gpuwarden.ops.foundation.safetext import log_line, printable
from gpuwarden.ops.foundation.settings import Settings

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any

    from gpuwarden.ops.foundation.filecache import FileCache

SPEC = "spec.json"  # what to run: written by the launcher, read by the shim
STATE = "state.json"  # what happened: written by the shim only
STATUS = "status.jsonl"  # the engine's status protocol lines
LOG = "engine.log"  # the engine's stdout and stderr, size-capped
SHIM_LOG = "shim.log"  # the shim's own complaints
# The shim writes a line starting so into engine.log before each start of the engine.
RUN_MARK = "--- gpuwarden: "

# Phases after which the shim has nothing left to do and may be gone.
FINAL_PHASES = ("exited", "crashed")


def engines_root(state_dir: Path) -> Path:
    return state_dir / statedir.ENGINES


def engine_dir(state_dir: Path, name: str) -> Path:
    return engines_root(state_dir) / statedir.valid_name(name)  # `engines logs ../..` climbs nowhere


def read_state(state_dir: Path, name: str) -> dict[str, Any] | None:
    record: dict[str, Any] | None = statefiles.load(engine_dir(state_dir, name) / STATE, statefiles.ENGINE_STATE,
                                                    root=state_dir)
    return record


def read_spec(state_dir: Path, name: str) -> dict[str, Any] | None:
    spec: dict[str, Any] | None = statefiles.load(engine_dir(state_dir, name) / SPEC, statefiles.ENGINE_SPEC,
                                                  root=state_dir)
    return spec


def names(state_dir: Path) -> list[str]:
    try:
        root = statedir.open_dir(state_dir, statedir.ENGINES)
    except FileNotFoundError:
        return []
    with root:
        out = []
        for name in root.listdir():
            if name.startswith("."):
                continue
            try:
                with root.subdir(name) as d:
                    if d.stat(SPEC) is not None or d.stat(STATE) is not None:
                        out.append(name)
            except GpuwardenError:
                out.append(name)  # listed, so that `engines list` says what is wrong with it
        return sorted(out)


def alive(pid: int | None, start: int | None, proc_root: Path = Path("/proc")) -> bool:
    """True when `pid` is still the process first recorded (same start ticks) and not a zombie."""
    if not pid or start is None:
        return False
    facts = procs.stat_facts(pid, proc_root)  # one read: the snapshot asks this for every engine, every second
    return facts is not None and facts[3] == start and facts[1] not in ("Z", "X")


def shim_alive(record: dict[str, Any], proc_root: Path = Path("/proc")) -> bool:
    return alive(record.get("shim_pid"), record.get("shim_start"), proc_root)


def is_stale(record: dict[str, Any], proc_root: Path = Path("/proc")) -> bool:
    """A record is stale when it claims the engine is still supervised but its shim is gone."""
    return record.get("phase") not in FINAL_PHASES and not shim_alive(record, proc_root)


def last_line(path: Path, limit: int = 8192, cache: "FileCache | None" = None) -> str | None:
    """The log's last line; with a sampler's `cache`, read again only when the log changed."""
    def read(p: Path) -> str | None:
        lines = tail(p, 1, limit)
        return lines[-1] if lines else None
    if cache is not None:
        line: str | None = cache.get(path, read, "last-line")
        return line
    try:
        return read(path)
    except OSError:
        return None


def tail(path: Path, count: int, limit: int = 65536) -> list[str]:
    """The last `count` non-empty lines of a log (from its end, at most `limit` bytes), ready to print:
    secrets redacted, terminal escapes shown. The log's directory is opened through the checked state dir."""
    try:
        d = statedir.open_dir(path.parent)
    except FileNotFoundError:
        return []
    with d:
        try:
            fd = d.open(path.name)
        except FileNotFoundError:
            return []
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, limit, max(0, size - limit))
        finally:
            os.close(fd)
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    if size > limit and lines:
        lines = lines[1:]  # the first line read is probably cut
    return [log_line(redact.text(ln)) for ln in lines[-count:]]


def run_tail(path: Path, count: int) -> list[str]:
    """The last `count` lines the engine wrote in its latest run (after the shim's last start mark)."""
    lines = tail(path, max(count, 200), limit=262144)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(RUN_MARK):
            lines = lines[i + 1:]
            break
    return lines[-count:]


def info_from(name: str, record: dict[str, Any] | None, spec: dict[str, Any] | None, state_dir: Path,
              proc_root: Path = Path("/proc"), cache: "FileCache | None" = None,
              memo: "dict[str, tuple[tuple[Any, ...], EngineInfo]] | None" = None) -> EngineInfo:
    """`memo` (a sampler's, with its `cache`): name -> what the last EngineInfo was made of, and it. The records
    come from the cache, the same objects while their files are unchanged, so an engine whose record, spec,
    shim and last log line are all as before is the very same EngineInfo again."""
    log_path = engine_dir(state_dir, name) / LOG
    stale = record is not None and is_stale(record, proc_root)
    last = last_line(log_path, cache=cache)
    made_of = (record, spec, stale, last)
    if memo is not None:
        prev = memo.get(name)
        if prev is not None and prev[0][0] is record and prev[0][1] is spec and prev[0][2:] == made_of[2:]:
            return prev[1]
    info = _info(name, record, spec, log_path, stale, last)
    if memo is not None:
        memo[name] = (made_of, info)
    return info


def _info(name: str, record: dict[str, Any] | None, spec: dict[str, Any] | None, log_path: Path, stale: bool,
          last: str | None) -> EngineInfo:
    gpu = (spec or {}).get("engine", {}).get("gpu")
    if record is None:
        # Spec written, shim not yet reporting: the launcher is still starting it.
        return EngineInfo(name=printable(name), gpu=gpu, phase="starting", log_path=str(log_path), last_log_line=last)
    phase = "stale" if stale else printable(str(record.get("phase", "starting")))
    raw_phases, raw_crashes = record.get("phases"), record.get("crashes")
    phases: dict[str, Any] = raw_phases if isinstance(raw_phases, dict) else {}
    crashes: dict[str, Any] = raw_crashes if isinstance(raw_crashes, dict) else {}

    def text(v: object) -> str | None:
        return (None if v is None else printable(str(v)))  # records are files: no escapes reach a terminal
    return EngineInfo(
        name=printable(name),
        gpu=record.get("gpu", gpu),
        phase=phase,
        phase_since=_number(phases.get(phase)),
        pid=record.get("pid"),
        shim_pid=record.get("shim_pid"),
        started_at=record.get("started_at"),
        exit_code=record.get("exit_code"),
        signal=text(record.get("signal")),
        core_dumped=record.get("core_dumped"),
        restarts=int(record.get("restarts", 0)),
        log_path=str(log_path),
        last_log_line=last,
        bundle=text(record.get("bundle")),
        stale=stale,
        registrations=registrations_of(record),
        crashes={str(k): int(v) for k, v in crashes.items() if isinstance(v, int) and not isinstance(v, bool)},
        host_ledger=host_ledger_from(record.get("host_ledger")),
    )


def registrations_of(record: dict[str, Any]) -> tuple[Registration, ...]:
    """The registration records the shim kept (gpuwarden.ops.engines.registrations), as model objects."""
    names: tuple[str, ...] = Registration.__record_fields__  # type: ignore[attr-defined]
    return tuple(Registration(**_fields(raw, names))
                 for raw in record.get("registrations") or ()
                 if isinstance(raw, dict) and isinstance(raw.get("kind"), str) and isinstance(raw.get("outcome"), str))


def _fields(raw: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: raw.get(k) for k in names}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def list_engines(settings: Settings, cache: "FileCache | None" = None,
                 memo: "dict[str, tuple[tuple[Any, ...], EngineInfo]] | None" = None) -> list[EngineInfo]:
    """Every engine with a record in the state dir, as its shim last wrote it (stale when the shim is gone).

    `cache`: a sampler's FileCache; the snapshot lists engines on every refresh and parses a record again
    only when its shim rewrote it. `memo`: see info_from (only with a cache; engines no longer listed leave it)."""
    out = []
    seen = []
    for name in names(settings.state_dir):
        folder = engine_dir(settings.state_dir, name)
        try:
            record = statefiles.load_cached(folder / STATE, statefiles.ENGINE_STATE, root=settings.state_dir,
                                            cache=cache)
            spec = statefiles.load_cached(folder / SPEC, statefiles.ENGINE_SPEC, root=settings.state_dir, cache=cache)
        except GpuwardenError as exc:
            why = exc.problem if isinstance(exc, statedir.StateFileError) else exc.message
            out.append(EngineInfo(name=printable(name), gpu=None, phase="stale", stale=True,
                                  last_log_line=printable(f"state file is corrupt: {why}")))
            continue
        out.append(info_from(name, record, spec, settings.state_dir, settings.proc_root, cache,
                             memo if cache is not None else None))
        seen.append(name)
    if memo is not None and len(memo) > len(seen):
        for gone in memo.keys() - set(seen):
            del memo[gone]
    return out


def get(settings: Settings, name: str) -> EngineInfo | None:
    return next((e for e in list_engines(settings) if e.name == name), None)
