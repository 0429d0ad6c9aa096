"""CLI: `gpuwarden history` — per-GPU VRAM, residual and holders over time, and the node's events.

From the agent when it answers; else from what a stopped agent left in the state dir (the minute trend and
the event log).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Optional

import typer
from gpuwarden.playbooks.cli.commands.playbook_options import GPU_INDEX

from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes, parse_duration
from gpuwarden.ops.sources.choose import HISTORY, agent_reply
from gpuwarden.ops.services.agent_daemon import agent_dir
from gpuwarden.ops.agent.events import read_files
from gpuwarden.ops.agent.history import read_trend
from gpuwarden.playbooks import nodecheck

SPARK = " ▁▂▃▄▅▆▇█"


def _spark(values: list[float | None], top: float) -> str:
    """One cell per value: a gap (no sample) is blank, a sample is at least the lowest bar, so a series that stayed
    at zero draws a flat line as wide as the others, not an empty `||`."""
    bars = SPARK[1:]
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        else:
            level = v / top if top > 0 else 0.0
            out.append(bars[min(len(bars) - 1, max(0, round(level * (len(bars) - 1))))])
    return "".join(out)


def _bar(label: str, values: list[float | None], top: float) -> str:
    """One series' line: its sparkline between bars, or, when nothing in it is above zero, words (issue 36: an
    all-zero series drew as an empty `||`)."""
    points = _sample(values, 60)
    if top <= 0 or not any(v for v in points if v):
        known = [v for v in values if v is not None]
        return f"  {label:<8} {'0 B throughout' if known else 'no readings'} ({len(values)} points)"
    return f"  {label:<8} |{_spark(points, top)}|"


def _sample(values: list, width: int) -> list:
    """At most `width` points: the max of each stretch (a spike must not vanish)."""
    if len(values) <= width:
        return values
    step = len(values) / width
    out = []
    for i in range(width):
        part = [v for v in values[int(i * step):int((i + 1) * step)] if v is not None]
        out.append(max(part) if part else None)
    return out


def _document(settings: Settings, gpu: int | None, since: float, resolution: str) -> tuple[dict, str]:
    q = f"/v1/history?since={since:.3f}&resolution={resolution}&events=1" + (f"&gpu={gpu}" if gpu is not None else "")
    reply = agent_reply(settings, HISTORY, q)  # the state dir's agent, whatever roots this command reads
    if reply is not None:
        return reply.json(), "agent"
    directory = agent_dir(settings.state_dir)
    if not directory.is_dir():
        raise GpuwardenError(f"no agent history in {settings.state_dir} and no agent answers",
                             "start one with `gpuwarden agent` (or `systemctl start gpuwarden-agent`)")
    events = [e for e in read_files(directory) if e["ts"] >= since and (gpu is None or e.get("gpu") == gpu)]
    hist = read_trend(directory)
    return hist.document(gpu, since, "minute", events[-10000:]), "files"


def _require_gpu(settings: Settings, gpu: int) -> None:
    """"no GPU 9" (exit 1) as fix, drain and gpu-check say it; a node that cannot be read here (a copied state
    dir) leaves the question to the history itself."""
    try:
        snap = nodecheck.snapshot(settings)
    except NotFound:
        raise
    except GpuwardenError:
        return
    nodecheck.require_gpu(snap, gpu)


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("history")
def history_cmd(
    ctx: typer.Context,
    gpu: Optional[int] = typer.Argument(None, parser=GPU_INDEX, help="Only this GPU (default: every GPU)."),
    since: str = typer.Option("1h", "--since", metavar="DURATION",
                              help="How far back: 30m, 2h, 7d (the per-refresh series covers the last hour, "
                                   "the per-minute one seven days)."),
    resolution: str = typer.Option("auto", "--resolution", help="auto, fine (every refresh) or minute."),
    json_out: bool = typer.Option(False, "--json", help="The gpuwarden.history/1 document (with events)."),
) -> None:
    """Show VRAM used, residual VRAM and holders per GPU over time, and the node's events (residual
    appeared/cleared, holders, engine phases, crashes, drains, playbook steps, kernel-log findings)."""
    settings: Settings = ctx.obj
    if resolution not in ("auto", "fine", "minute"):
        raise GpuwardenError(f"unknown resolution {resolution!r}", "choose auto, fine or minute")
    start = time.time() - parse_duration(since)
    if gpu is not None:
        _require_gpu(settings, gpu)
    doc, source = _document(settings, gpu, start, resolution)
    if gpu is not None and str(gpu) not in doc["gpus"]:
        raise GpuwardenError(f"no history for GPU {gpu}",
                             f"GPUs with history: {', '.join(doc['gpus']) or 'none yet'}")
    if json_out:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    typer.echo(f"history since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(start))}"
               + ("" if source == "agent" else " (agent not running: per-minute trend from the state dir)"))
    for g, series in sorted(doc["gpus"].items(), key=lambda kv: int(kv[0])):
        for res, s in series.items():
            used = s.get("used") or s.get("used_max") or []
            residual = s.get("residual") or s.get("residual_max") or []
            if not used:
                continue
            top = max((v for v in used if v is not None), default=0)
            peak_res = max((v for v in residual if v is not None), default=0)
            typer.echo(f"GPU {g} ({res}, {s['points']} points)  used peak {fmt_bytes(top)}  "
                       f"residual peak {fmt_bytes(max(peak_res, 0))}")
            typer.echo(_bar("used", used, top))
            typer.echo(_bar("residual", residual, max(top, peak_res, 1)))
    events = doc.get("events") or []
    typer.echo("" if doc["gpus"] else "no samples yet")
    typer.echo(f"{len(events)} event(s)" + (":" if events else ""))
    for e in events[-50:]:
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(e["ts"]))
        typer.echo(f"  {when}  {e['level']:<7} {e['text']}")
