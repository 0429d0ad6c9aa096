"""What `gpuwarden status` does, without the CLI framework: ask the agent when its socket answers, else sample
the node here; print the report (or the snapshot document) and return the exit status.

Exit 0 healthy, 1 needs attention (or the agent's data is stale), 2 error — including "no GPU backend works
here", which the automatic fallback to the simulated node must never turn into "healthy".
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpuwarden.ops.foundation import interrupts
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.agent import client
from gpuwarden.ops.foundation.model import SnapshotWarning, snapshot_from_dict
from gpuwarden.ops.foundation.paths import AGENT_SOCKET


def _own_config_problem(settings: Settings) -> str | None:
    """The agent read its own node config; a --config (or GPUWARDEN_CONFIG) given to this command that does
    not load must still be said, as a sampled status says it. None when none was given or it loads."""
    if "--config" not in settings.cli_words and not os.environ.get("GPUWARDEN_CONFIG"):
        return None
    if not settings.config_path.exists():
        return None  # no file is no config, as a sampled status has it
    # deferred: only with a config file: status otherwise goes without nodeconfig (typing, tomllib)
    from gpuwarden.ops.config import nodeconfig
    try:
        nodeconfig.load(settings)
    except GpuwardenError as exc:
        return (f"node config unusable, arena and launch settings ignored: {exc.message} "
                "(see `gpuwarden config check`)")
    return None


def local_sampler(settings: Settings, use_pidfds: bool):
    # deferred: status answered by the agent samples nothing: no backend, no sampler
    from gpuwarden.ops.node.backends.select import open_backend
    from gpuwarden.ops.sampling.sampler import Sampler
    # The automatic fallback to the simulated node is for the console's demos; status says no backend works.
    backend = open_backend(settings)
    return Sampler(settings, backend, use_pidfds=use_pidfds)


def _columns() -> int:
    """The terminal's width (COLUMNS first, as shutil.get_terminal_size does, without importing shutil)."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 100
    except (AttributeError, ValueError, OSError):
        return 100


def _render(settings: Settings, snap, width: int | None = None) -> str:
    # deferred: `status --json` renders no text
    from gpuwarden.playbooks.cli.hints import Invocation
    from gpuwarden.playbooks.cli.status_text import render
    # Hints in warnings name commands to paste: they get the global options this command was given.
    return Invocation(list(settings.cli_words)).paste_ready(render(snap, width or _columns())) or ""


def run(settings: Settings, *, json_out: bool = False, watch: bool = False, interval: float = 2.0,
        bundle: Path | None = None) -> int:
    """Show the node once (or until Ctrl-C with watch); the exit status of the last report."""
    if bundle is not None:
        # deferred: only `status --bundle` reads a bundle (tarfile)
        from gpuwarden.ops.bundle.replay import snapshot_from_bundle
        snap = snapshot_from_bundle(bundle, settings)
        _show(settings, snap, json_out, watch)
        return 1 if snap.needs_attention() else 0
    reply = client.reply_for(settings)
    if reply is not None and not watch:
        stale = reply.headers.get("x-gpuwarden-stale") == "1"
        attention = reply.headers.get("x-gpuwarden-needs-attention") == "1"
        problem = _own_config_problem(settings)
        if json_out and problem is None:
            sys.stdout.buffer.write(reply.body + b"\n")
            sys.stdout.flush()
        elif json_out:
            import json
            doc = reply.json()
            doc["warnings"] = [*(doc.get("warnings") or []), {"code": "config-unusable", "message": problem}]
            sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        else:
            snap = snapshot_from_dict(reply.json())
            if problem is not None:
                from dataclasses import replace
                snap = replace(snap, warnings=(*snap.warnings, SnapshotWarning("config-unusable", problem)))
            sys.stdout.write(_render(settings, snap) + "\n")
        return 1 if attention or stale else 0
    if reply is not None:
        return _watch_agent(settings, json_out, interval)
    sampler = local_sampler(settings, use_pidfds=watch)
    try:
        snap = sampler.snapshot(deep=True)
        if not watch:
            _show(settings, snap, json_out, False)
            return 1 if snap.needs_attention() else 0
        try:
            while True:
                _show(settings, snap, json_out, True, interval)
                time.sleep(interval)
                snap = sampler.snapshot()
        except KeyboardInterrupt as exc:
            interrupts.ctrl_c_only(exc)  # Ctrl-C ends a watch: the last view's code; SIGTERM/SIGHUP do not
            return 1 if snap.needs_attention() else 0
    finally:
        sampler.close()


def _watch_agent(settings: Settings, json_out: bool, interval: float) -> int:
    code = 0
    try:
        while True:
            reply = client.get(settings.state_dir / AGENT_SOCKET, "/v1/snapshot")
            if reply is None or reply.status != 200:
                raise GpuwardenError("the agent stopped answering", "run `gpuwarden status` again to sample here")
            snap = snapshot_from_dict(reply.json())
            code = 1 if snap.needs_attention() or (snap.agent or {}).get("stale") else 0
            _show(settings, snap, json_out, True, interval)
            time.sleep(interval)
    except KeyboardInterrupt as exc:
        interrupts.ctrl_c_only(exc)
        return code


def _show(settings: Settings, snap, json_out: bool, watch: bool, interval: float = 0.0) -> None:
    if json_out:
        sys.stdout.write(snap.to_json() + "\n")  # compact, as the agent serves it: scripts parse, jq pretties
        sys.stdout.flush()
        return
    text = _render(settings, snap)
    if not watch:
        sys.stdout.write(text + "\n")
        return
    # Home + clear-to-end keeps the screen from flickering on slow SSH links; a pipe or a log file gets
    # plain reports one after another, no escape codes.
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
    sys.stdout.write(clear + text + (f"\n\n(every {interval:g}s, Ctrl-C to stop)\n" if interval else "\n"))
    sys.stdout.flush()
