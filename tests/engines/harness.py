"""Helpers for supervision tests: node configs of fake engines, polling with deadlines, and cleanup.

Every test that starts shims uses the `supervised` fixture, which stops whatever is still running.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

FAKE = Path(__file__).resolve().with_name("fake_engine.py")


def engine_argv(*extra: str) -> list[str]:
    return [sys.executable, str(FAKE), *extra]


def write_config(path: Path, count: int, *, slots: int = 1, register_s: float = 0.3, crash_at: int = 0,
                 marker_dir: Path | None = None, log_only: bool = False, registration_timeout: float = 30,
                 stop_grace: float = 3, restart: str = "no", extra: tuple[str, ...] = (),
                 engine_keys: str = "") -> Path:
    """A node config of `count` fake engines e0..e{count-1}, engine i on GPU i."""
    args = ["--register-s", str(register_s), *extra]
    if crash_at:
        args += ["--crash-at-overlap", str(crash_at)]
    if marker_dir is not None:
        args += ["--marker-dir", str(marker_dir)]
    if log_only:
        args += ["--log-only"]
    lines = [
        "[stagger]", f"slots = {slots}", f"registration_timeout = {registration_timeout}", "",
        "[defaults]", f"stop_grace = {stop_grace}", f'restart = "{restart}"',
    ]
    if log_only:
        lines += ['progress = "log"', 'registered_pattern = "session is up"', 'ready_pattern = "^serving"']
    lines.append("")
    for i in range(count):
        lines += ["[[engines]]", f'name = "e{i}"', f"gpu = {i}", f"argv = {json.dumps(engine_argv(*args))}"]
        if engine_keys:
            lines.append(engine_keys)
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def records(state_dir: Path) -> dict[str, dict]:
    from gpuwarden.ops.engines import state as st
    return {n: st.read_state(state_dir, n) or {} for n in st.names(state_dir)}


def registration_windows(state_dir: Path) -> dict[str, tuple[float, float]]:
    """Each engine's [registering, registered] interval from its own status protocol lines."""
    from gpuwarden.ops.engines import state as st
    from gpuwarden.ops.foundation.status_protocol import read_events
    out = {}
    for name in st.names(state_dir):
        events = read_events(st.engine_dir(state_dir, name) / st.STATUS)
        start = next(e.ts for e in events if e.phase == "registering")
        end = next(e.ts for e in events if e.phase == "registered")
        out[name] = (start, end)
    return out


def stop_everything(state_dir: Path) -> None:
    """Stop every engine and shim of this state dir, politely then not."""
    from gpuwarden.ops.engines import control
    from gpuwarden.ops.engines import state as st
    from gpuwarden.ops.foundation.settings import Settings
    settings = Settings(state_dir=state_dir)
    for name in st.names(state_dir):
        try:
            control.stop(settings, name, timeout_s=1.0)
        except Exception:
            pass
    for record in records(state_dir).values():
        for pid_key, start_key in (("pid", "pid_start"), ("shim_pid", "shim_start")):
            if st.alive(record.get(pid_key), record.get(start_key)):
                try:
                    os.kill(record[pid_key], signal.SIGKILL)
                except ProcessLookupError:
                    pass


def start_sim_tenant_engine(state_dir: Path, name: str, gpu: int, size: str) -> None:
    """Start `gpuwarden sim hold` as a supervised engine on `gpu` and wait until it serves."""
    from gpuwarden.ops.engines import control
    from gpuwarden.ops.engines import state as st
    from gpuwarden.ops.config.nodeconfig import EngineConfig
    from gpuwarden.ops.foundation.settings import Settings
    from helpers.simnode import cli_argv, wait_for
    argv = tuple(cli_argv(state_dir, "sim", "hold", "--gpu", str(gpu), "--size", size))
    eng = EngineConfig(name=name, argv=argv, gpu=gpu, progress="log", registered_pattern="^holding",
                       stop_grace=3.0, gated=False)
    control.start(Settings(state_dir=state_dir), eng, gate_slots=1, registration_timeout=20, workdir=None)
    wait_for(lambda: (st.read_state(state_dir, name) or {}).get("phase") == "serving", 20, f"{name} serving")


@pytest.fixture
def supervised(state_dir: Path):
    """The test's state dir; every engine started under it is stopped afterwards."""
    yield state_dir
    stop_everything(state_dir)
