"""CLI: `gpuwarden doctor` — is this node fit to serve? Every check with its verdict, reason and fix.

Exit 0 every check passed (or did not apply, or could not tell), 1 a warning or a failure, 2 it could not run.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Optional

import typer

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.jsondoc import dumps
from gpuwarden.ops.doctor.checks import REGISTRY
from gpuwarden.ops.doctor.diagnose import diagnose, diagnose_bundle, document
from gpuwarden.playbooks.cli.doctor_report import render, use_colour


def _progress_printer():
    """On a terminal, the check being waited for (a slow or hung one shows by name until its timeout)."""
    if not sys.stderr.isatty():
        return None

    def show(check: str, done: int, total: int) -> None:
        sys.stderr.write(f"\r\x1b[2Kchecking {done}/{total}: waiting for {check}")
        sys.stderr.flush()
    return show


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("doctor")
def doctor_cmd(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the gpuwarden.doctor/1 document (for scripts)."),
    only: Optional[str] = typer.Option(
        None, "--only", metavar="CHECK,...",
        help="Run only these checks (ids or groups, comma-separated; --list shows them)."),
    bundle: Optional[Path] = typer.Option(
        None, "--bundle", help="Check the node as an incident bundle (`gpuwarden bundle`) captured it."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", min=0.05, show_default=False,
        help="Seconds each check may take (default 1.5; 4 for the checks that ask NVML, which initializes "
        "GPUs without persistence mode); a check still running then is reported as cut, never waited for."),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Show passing checks in full, with what each read."),
    list_checks: bool = typer.Option(False, "--list", help="List the checks (id, group, title) and exit."),
) -> None:
    """Check that this node is fit to serve: kernel and driver (and ROCm against AMD's support matrix),
    driver parameters, IOMMU/ACS/PCIe links/large BAR/NUMA, memory for the arena (/dev/shm, memlock, KFD
    budget, THP, swap), firmware, XGMI hives, RAS counters, NVIDIA persistence/MIG/ECC/pages, and the agent.

    Checks run concurrently, each under --timeout. Every finding names what it read, why it passes or not,
    and the fix. Exit status: 0 nothing to fix, 1 a warning or failure, 2 the doctor could not run.
    """
    settings: Settings = ctx.obj
    if list_checks:
        width = max(len(c.id) for c in REGISTRY)
        for c in REGISTRY:
            typer.echo(f"{c.id:<{width}}  {c.group:<7}  {c.title}")
        raise typer.Exit(0)
    names = [n for n in (only or "").split(",") if n.strip()] or None
    progress = _progress_printer()
    try:
        if bundle is not None:
            report = diagnose_bundle(bundle, settings, only=names, timeout_s=timeout, progress=progress)
        else:
            report = diagnose(settings, only=names, timeout_s=timeout, progress=progress)
    finally:
        if progress:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
    if json_out:
        sys.stdout.write(dumps(document(report)) + "\n")
    else:
        typer.echo(render(report, shutil.get_terminal_size((100, 24)).columns, verbose=verbose,
                          colour=use_colour(sys.stdout)))
    raise typer.Exit(report.exit_code)

