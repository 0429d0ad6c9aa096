"""CLI: `gpuwarden metrics` — one Prometheus exposition of the node on stdout, or `--textfile DIR` for
node_exporter's textfile collector. Works without an agent (it samples once); see the README's Monitoring.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.metrics.collector import render
from gpuwarden.ops.metrics.plan import PlanCache
from gpuwarden.ops.metrics.reading import MetricsOptions, Reading
from gpuwarden.ops.sources.choose import METRICS, choose
from gpuwarden.ops.sources.kinds import AgentSource
from gpuwarden.ops.metrics.textfile import write

if TYPE_CHECKING:
    from gpuwarden.ops.sources.kinds import Source


def _target(per_process: bool, hostname: bool) -> str:
    """The agent's /metrics with this command's options as its query."""
    query = "&".join(f"{k}=1" for k, on in (("per_process", per_process), ("hostname", hostname)) if on)
    return "/metrics" + (f"?{query}" if query else "")


def _exposition(settings: Settings, source: Source, per_process: bool,
                hostname: str | None) -> tuple[bytes, list[str]]:
    """The exposition of a snapshot taken now, and what did not answer in time (one line per stale GPU or file)."""

    snap = source.snapshot(deep=True)
    reading = Reading(snap, "oneshot", now=time.time(), plan=PlanCache(settings).current())
    late = [w.message for w in snap.warnings if w.code == "stale"]
    return render(reading, MetricsOptions(per_process=per_process, hostname=hostname)), late


def _stale_in(body: bytes) -> list[str]:
    """The GPUs the agent's exposition marks gpuwarden_gpu_stale 1, as lines for stderr."""
    out = []
    for line in body.decode(errors="replace").splitlines():
        if not line.startswith("gpuwarden_gpu_stale{"):
            continue
        labels, _, value = line.rpartition(" ")
        try:
            if float(value) != 1:
                continue
        except ValueError:
            continue
        gpu = labels.partition('gpu="')[2].partition('"')[0]
        out.append(f"GPU {gpu}: a read did not answer within the agent's deadline: the GPU may be hung "
                   "(`gpuwarden status` names the file)")
    return out


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("metrics")
def metrics_cmd(
    ctx: typer.Context,
    textfile: Optional[Path] = typer.Option(
        None, "--textfile", metavar="DIR",
        help="Write DIR/gpuwarden.prom atomically (node_exporter's --collector.textfile.directory) instead "
             "of printing."),
    per_process: bool = typer.Option(False, "--per-process",
                                     help="Add VRAM per process and GPU (the largest 256 pairs)."),
    hostname_label: bool = typer.Option(False, "--hostname-label",
                                        help="Add a hostname label to every series (Prometheus adds "
                                             "instance itself; this is for textfiles and federation)."),
) -> None:
    """Print the node's metrics once, in Prometheus' text format: the running agent's (over its socket),
    else a sample taken now, in which the kernel-log counts and residual ages that only the agent keeps
    are left out.

    A GPU whose reads do not answer within --read-timeout is exported with gpuwarden_gpu_stale 1 and
    without the readings it did not give; it is named on stderr and the exit status is 1.
    """
    settings: Settings = ctx.obj
    # The running agent's exposition (with its kernel-log counts and residual ages), else a sample taken here:
    # ops/sources/choose.py decides.
    source = choose(settings, METRICS, target=_target(per_process, hostname_label))
    try:
        if isinstance(source, AgentSource):
            body, late = source.reply.body, _stale_in(source.reply.body)
        else:
            body, late = _exposition(settings, source, per_process, os.uname().nodename if hostname_label else None)
    finally:
        source.close()
    if textfile is None:
        typer.echo(body.decode(), nl=False)
    else:
        path = write(textfile, body)
        typer.echo(f"wrote {path} ({len(body)} bytes)", err=True)
    for line in late:
        typer.echo(f"gpuwarden: {line}", err=True)
    if late:
        raise typer.Exit(1)
