"""CLI: `gpuwarden report BUNDLE` — an upstream bug report (Markdown, or --json) written from an incident bundle."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpuwarden.ops.foundation.errors import GpuwardenError, NotFound
from gpuwarden.ops.foundation.jsondoc import document, dumps
from gpuwarden.ops.bugreport import build
from gpuwarden.ops.bugreport.render import markdown


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("report")
def report_cmd(
    ctx: typer.Context,
    bundle: Path = typer.Argument(..., metavar="BUNDLE", help="An incident bundle from `gpuwarden bundle`."),
    json_out: bool = typer.Option(False, "--json", help="Print a gpuwarden.report/1 document."),
) -> None:
    """Write the bug report an upstream tracker (ROCm, amdgpu, NVIDIA) asks for, from an incident bundle:
    environment (GPUs and gfx targets, drivers, ROCm/CUDA, kernel and its command line, amdgpu parameters,
    firmware), what happened (triage headline, crash signatures, registration results), the `arena probe`
    command that reproduces it, what doctor ruled out, the matching known issues, and the attachments with
    their sizes. Redacted like every gpuwarden output; paste it, then attach the files it lists.
    """
    if not bundle.exists():
        raise NotFound(f"no such bundle: {bundle}", "make one with `gpuwarden bundle`")
    if not bundle.is_file():
        raise GpuwardenError(f"{bundle} is not a file", "give the .tar.gz that `gpuwarden bundle` wrote")
    body = build(bundle, ctx.find_root().obj)
    if json_out:
        sys.stdout.write(dumps(document("report", body), indent=2) + "\n")
    else:
        sys.stdout.write(markdown(body))
