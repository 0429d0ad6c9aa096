"""What `gpuwarden status` does, without the CLI framework: show the snapshots of the source ops/sources/choose.py
picks (a bundle, the agent, the node sampled here) as a report or the snapshot document; return the exit status.

Exit 0 healthy, 1 needs attention (or the agent's data is stale), 2 error — including "no GPU backend works
here", which the automatic fallback to the simulated node must never turn into "healthy".
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gpuwarden.ops.foundation import interrupts
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.sources.choose import AGENT, BUNDLE, ONCE, WATCH, choose, reply_exit_code
from gpuwarden.ops.sources.kinds import AgentSource
from gpuwarden.ops.foundation.model import SnapshotWarning

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: status goes without it
if TYPE_CHECKING:
    from gpuwarden.ops.sources.kinds import Source


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
    # deferred: keeps `gpuwarden status --json` cheap (0.3 ms there, with the shlex hints imports): it renders no text
    from gpuwarden.playbooks.cli.hints import Invocation
    # deferred: keeps `gpuwarden status --help` cheap (4.7 ms there)
    from gpuwarden.playbooks.cli.status_text import render
    # Hints in warnings name commands to paste: they get the global options this command was given.
    return Invocation(list(settings.cli_words)).paste_ready(render(snap, width or _columns())) or ""


def run(settings: Settings, *, json_out: bool = False, watch: bool = False, interval: float = 2.0,
        bundle: Path | None = None) -> int:
    """Show the node once (or until Ctrl-C with watch); the exit status of the last report."""
    # Where the snapshots come from (bundle, agent, sampled here) is ops/sources/choose.py's to say.
    source = choose(settings, WATCH if watch else ONCE, bundle=bundle)
    try:
        if source.kind == BUNDLE:
            snap = source.snapshot()
            _show(settings, snap, json_out, watch)
            return 1 if snap.needs_attention() else 0
        if isinstance(source, AgentSource) and not watch:
            return _agent_once(settings, source, json_out)
        if not watch:
            snap = source.snapshot(deep=True)
            _show(settings, snap, json_out, False)
            return 1 if snap.needs_attention() else 0
        return _watch(settings, source, json_out, interval)
    finally:
        source.close()


def _agent_once(settings: Settings, source: AgentSource, json_out: bool) -> int:
    """The agent's snapshot, once: its bytes untouched for --json unless the source has warnings to add."""
    reply = source.reply
    warnings = source.warnings
    if json_out and not warnings:
        sys.stdout.buffer.write(reply.body + b"\n")
        sys.stdout.flush()
    elif json_out:
        doc = reply.json()
        doc["warnings"] = [*(doc.get("warnings") or []), *(w.to_dict() for w in warnings)]
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    else:
        snap = source.snapshot()
        if warnings:
            # deferred: keeps `gpuwarden status --json` cheap (6.7 ms there)
            from dataclasses import replace
            snap = replace(snap, warnings=(*snap.warnings, *(SnapshotWarning(w.code, w.message) for w in warnings)))
        sys.stdout.write(_render(settings, snap) + "\n")
    return reply_exit_code(reply)


def _watch(settings: Settings, source: Source, json_out: bool, interval: float) -> int:
    """A report every `interval` seconds until Ctrl-C; the exit status of the last one."""
    code = 0
    if source.kind != AGENT:
        snap = source.snapshot(deep=True)  # a deep first look (device-file holders); later refreshes are quick
        code = 1 if snap.needs_attention() else 0
    else:
        snap = None
    try:
        while True:
            if snap is None:
                snap = source.snapshot()
                code = 1 if snap.needs_attention() or (snap.agent or {}).get("stale") else 0
            _show(settings, snap, json_out, True, interval)
            time.sleep(interval)
            snap = None
    except KeyboardInterrupt as exc:
        interrupts.ctrl_c_only(exc)  # Ctrl-C ends a watch: the last view's code; SIGTERM/SIGHUP do not
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
