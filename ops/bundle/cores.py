"""Core dumps of crashed engines: find each one and store its backtrace (eu-stack, else gdb) in the bundle.

systemd-coredump keeps cores itself (`coredumpctl info PID` prints the stack); with a plain core_pattern
the core is a file in the engine's working directory. When neither tool exists the bundle says so.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from gpuwarden.ops.bundle.entries import FAILED, MISSING, Entry
from gpuwarden.ops.bundle.runner import run_command

MAX_FRAMES = "64"


def _engine(spec: dict[str, Any]) -> dict[str, Any]:
    """The engine's own settings: spec.json keeps them under "engine", beside the gate's."""
    inner = spec.get("engine")
    return inner if isinstance(inner, dict) else spec


def _executable(spec: dict[str, Any]) -> str | None:
    """The engine's program as a path the tools can open (argv[0] as given, found on PATH, or in its workdir)."""
    engine = _engine(spec)
    argv = engine.get("argv")
    exe = argv[0] if isinstance(argv, list) and argv and isinstance(argv[0], str) and argv[0] else None
    if exe is None:
        return None
    workdir = engine.get("workdir")
    if "/" in exe and not exe.startswith("/") and isinstance(workdir, str) and workdir:
        exe = str(Path(workdir) / exe)  # the supervisor starts it in its workdir, so ./bin/x means that one
    return shutil.which(exe)


def _core_candidates(spec: dict[str, Any], state: dict[str, Any], proc_root: Path) -> list[Path]:
    pid = state.get("pid")
    workdir = _engine(spec).get("workdir") or state.get("workdir")
    dirs = [Path(workdir)] if isinstance(workdir, str) and workdir else []
    pattern = ""
    try:
        pattern = (proc_root / "sys/kernel/core_pattern").read_text().strip()
    except OSError:
        pass
    out: list[Path] = []
    if pattern.startswith("/"):
        # an absolute template: only %p (pid) and %% are filled in; anything else is looked for by glob
        glob = pattern.replace("%%", "\0").replace("%p", str(pid)).replace("%P", str(pid))
        for spec_char in "ceghiIstuE":
            glob = glob.replace(f"%{spec_char}", "*")
        glob = glob.replace("\0", "%")
        parent = Path(glob).parent
        if parent.is_dir():
            out += sorted(parent.glob(Path(glob).name))
    elif pattern and not pattern.startswith("|"):
        name = pattern.replace("%p", str(pid)).replace("%%", "%")
        out += [d / name for d in dirs]
    for d in dirs:
        out += [d / "core", d / f"core.{pid}"]
    seen, unique = set(), []
    for p in out:
        if p not in seen and p.is_file():
            seen.add(p)
            unique.append(p)
    return unique


def backtrace_entries(name: str, spec: dict[str, Any], state: dict[str, Any], proc_root: Path,
                      deadline: float) -> list[Entry]:
    """Entries for one crashed engine: its stack from coredumpctl, or from its core file, or why there is none."""
    pid = state.get("pid")
    dest = f"engines/{name}/backtrace.txt"
    if not isinstance(pid, int):
        return []

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    if shutil.which("coredumpctl"):
        res = run_command(["coredumpctl", "info", "--no-pager", str(pid)], left())
        if res.exit_code == 0 and b"Stack trace" in res.stdout:
            return [Entry("engines", " ".join(res.argv), "command", path=dest, data=res.stdout, exit_code=0,
                          duration_s=res.duration_s)]
    cores = _core_candidates(spec, state, proc_root)
    if not cores:
        return [Entry("engines", f"core of {name} (pid {pid})", "file", status=MISSING,
                      error="no core dump found (coredumpctl has none; no core file in the engine's directory)")]
    core = cores[-1]
    exe_path = _executable(spec)
    tools = []
    if shutil.which("eu-stack"):
        tools.append(["eu-stack", f"--core={core}", "-m", "-b", "-n", MAX_FRAMES]
                     + ([f"--executable={exe_path}"] if exe_path else []))
    if shutil.which("gdb"):
        # gdb needs the executable to find the shared libraries' link map: with the core alone every frame is ??
        tools.append(["gdb", "-batch", "-nx", "-ex", f"bt {MAX_FRAMES}"]
                     + ([exe_path, str(core)] if exe_path else ["-c", str(core)]))
    if not tools:
        return [Entry("engines", str(core), "file", status=MISSING,
                      error=f"core {core} not read: neither eu-stack (elfutils) nor gdb is installed on this node")]
    errors = []
    for argv in tools:
        res = run_command(argv, left())
        if res.stdout.strip() and not res.timed_out:
            header = f"# {' '.join(argv)} (exit {res.exit_code})\n".encode()
            return [Entry("engines", " ".join(argv), "command", path=dest, data=header + res.stdout,
                          exit_code=res.exit_code, duration_s=res.duration_s)]
        errors.append(f"{argv[0]}: {res.error or (res.stderr.decode(errors='replace').strip()[-200:]) or 'no output'}")
    return [Entry("engines", str(core), "file", status=FAILED, error="; ".join(errors))]

