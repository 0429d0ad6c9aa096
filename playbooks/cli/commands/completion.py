"""Shell completion of GPU indexes and engine names, read from the node (not a command module itself).

Loaded only by the commands that complete those arguments, never on the CLI's start-up path. A backend
that hangs (a wedged GPU) must not hang the operator's shell: the GPU list gets one second, then nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path

import typer

from gpuwarden.ops.engines import state as st
from gpuwarden.ops.config import loader
from gpuwarden.ops.foundation.errors import GpuwardenError

LOOKUP_S = 1.0


def _settings(ctx: typer.Context):
    """Settings from the global options typed so far (completion never runs the global callback)."""
    params = ctx.find_root().params
    try:
        return loader.resolve({k: params.get(k) for k in ("state_dir", "config", "backend", "sysfs_root",
                                                          "proc_root")}, check=False)
    except GpuwardenError:  # a word still being typed (--backend am<TAB>): complete from the paths alone
        return loader.resolve({k: params.get(k) for k in ("state_dir", "config")}, environ={}, check=False)


def _gpu_list(ctx: typer.Context) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def look() -> None:
        # deferred: keeps `gpuwarden launch --help` cheap (1.8 ms there); only this path of the command needs it
        from gpuwarden.ops.node.backends.select import open_backend
        backend = open_backend(_settings(ctx))
        try:
            found.extend((str(g.index), g.name) for g in backend.gpus())
        finally:
            backend.close()
    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(LOOKUP_S)
    return list(found) if not t.is_alive() else []


def gpus(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """(index, name) of every GPU whose index starts with what was typed."""
    try:
        return [(i, name) for i, name in _gpu_list(ctx) if i.startswith(incomplete)]
    except Exception:  # completion offers what it can; an error here would print into the shell
        return []


def engines(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """(name, "GPU n: phase") of every engine in the state dir whose name starts with what was typed."""
    try:
        settings = _settings(ctx)
        out = []
        for name in st.names(Path(settings.state_dir)):
            if name.startswith(incomplete):
                record = st.read_state(settings.state_dir, name) or {}
                out.append((name, f"GPU {record.get('gpu', '?')}: {record.get('phase', 'not started')}"))
        return out
    except Exception:
        return []


def config_engines(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Engines the node config lists (what `launch` can start)."""
    try:
        # deferred: keeps `gpuwarden drain --help` cheap (13.3 ms there); only this path of the command needs it
        from gpuwarden.ops.config import nodeconfig
        config = nodeconfig.load(_settings(ctx))
        return [(e.name, f"GPU {e.gpu}") for e in config.engines if e.name.startswith(incomplete)]
    except Exception:
        return []


def choices(*values: str):
    """A completer of fixed words (scenario names, fault names)."""
    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]
    return complete
