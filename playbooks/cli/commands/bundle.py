"""CLI: `gpuwarden bundle` — gather the evidence of an incident into one .tar.gz, with a triage on top.

Collectors run concurrently under a per-collector timeout; failures are listed, never fatal.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes, parse_size
from gpuwarden.ops.foundation.jsondoc import document
from gpuwarden.ops.triage.render import headline, summary_lines
from gpuwarden.playbooks.bundle import BundlePlaybook
from gpuwarden.playbooks.framework import Event, run
from gpuwarden.playbooks.cli.output import event_printer
from gpuwarden.ops.bundle.collect import check_options

HELP = """Collect an incident bundle: kernel log (dmesg, else journalctl -k, else /dev/kmsg), amd-smi /
rocm-smi / nvidia-smi output, the gpuwarden snapshot, the raw sysfs/KFD/DRM-fdinfo and /proc files
the backends read (kept in their tree layout, so `gpuwarden status --bundle` replays them), amdgpu
module parameters, kernel command line, meminfo, memlock limits, every engine's state and log tail,
arenas, /proc/<pid>/{status,maps,limits,environ,cmdline} of engines and GPU holders, versions (kernel,
driver, HIP/HSA libraries loaded), core dumps — plus triage.md/triage.json and manifest.json.

Each collector runs under --timeout (a hung rocm-smi is killed with its process group); one that fails
or times out is listed in the manifest and the bundle goes on. Of a process environment only an
allow-list is kept (GPU visibility, ROCm/HIP/HSA/CUDA/NCCL/RCCL/TORCH tuning, PATH-like variables);
command lines are redacted option by option (--password X, -u user:pass, user:pass@ URLs) and logs by
pattern (tokens, passwords, keys, AWS/HF/OpenAI/GitHub-style tokens, Bearer headers; the list is in
ops/foundation/redact.py); the manifest says what was redacted, never the values. The archive is mode 0600, written to a temp name and renamed at the end, so a full
disk leaves nothing behind. Default output: <state dir>/bundles/."""


def _progress_printer():
    if not sys.stderr.isatty():
        return None

    def show(event: str, name: str, done: int, total: int) -> None:
        text = f"collecting {done}/{total}: {name}" if event == "collected" else f"writing {name}"
        sys.stderr.write("\r\x1b[2K" + text[:120])
        sys.stderr.flush()
    return show


def _print_result(result) -> None:
    m = result.manifest
    typer.echo(f"bundle: {result.path}")
    typer.echo(f"  {fmt_bytes(result.bytes)}, {len(m['items'])} files, {result.duration_s:.1f}s"
               + (" (as root)" if m["collected_by"]["root"] else f" (as {m['collected_by']['user']}, not root)"))
    problems = [c for c in m["collectors"] if c["status"] not in ("ok", "missing", "skipped")]
    absent = [c["name"] for c in m["collectors"] if c["status"] == "missing"]
    skipped = [c["name"] for c in m["collectors"] if c["status"] == "skipped"]
    for c in problems:
        typer.echo(f"  {c['name']}: {c['status']}" + (f" — {c['error']}" if c.get("error") else ""))
    if absent:
        typer.echo(f"  not installed here: {', '.join(absent)}")
    if skipped:
        typer.echo(f"  skipped (--safe-mode): {', '.join(skipped)}")
    denied = [e for e in m["not_collected"] if e["status"] == "permission-denied"]
    if denied:
        typer.echo(f"  could not read {len(denied)} item(s) without more privileges, e.g. "
                   + ", ".join(e["source"] for e in denied[:3]))
    red = m["redaction"]
    if red["total"]:
        typer.echo(f"  redacted {red['total']} secret(s): "
                   + ", ".join(f"{k} x{v}" for k, v in sorted(red["by_pattern"].items())))
    typer.echo(f"triage: {headline(result.report)}")
    for note in result.report.notes:
        if note.startswith("no kernel log"):
            typer.echo(f"  ! {note}")
    for line in summary_lines(result.report):
        typer.echo(f"  - {line}")


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("bundle", help=HELP)
def bundle_cmd(
    ctx: typer.Context,
    # a str, not a Path: Path drops the trailing "/" that says "a directory to make"
    output: Optional[str] = typer.Option(None, "--output", "-o", metavar="<path>",
                                         help="File or directory (an existing one, or one ending in /) for the "
                                              "bundle (default <state dir>/bundles/)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only log lines from the last DURATION (30m, 2h, 1d)."),
    safe_mode: bool = typer.Option(False, "--safe-mode",
                                   help="Skip the vendor tools that can hang on a wedged GPU (amd-smi, rocm-smi, nvidia-smi)."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds each collector may take.", min=0.1),
    max_bytes: str = typer.Option("16MiB", "--max-bytes", help="Cap per output file; the tail is kept "
                                  "(e.g. 4MiB; a plain number is bytes)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result (path, collectors, triage) as JSON."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be collected, collect nothing."),
) -> None:
    settings: Settings = ctx.obj
    playbook = BundlePlaybook(output=output, since=since, safe_mode=safe_mode, timeout_s=timeout,
                              max_bytes=parse_size(max_bytes, bare_bytes=True))
    if dry_run:
        check_options(since, timeout, playbook.max_bytes)  # a plan the real run would refuse is refused too
        raise typer.Exit(run(playbook, settings, sink=event_printer(json_out, settings.cli_words), dry_run=True).exit_code)
    progress = None if json_out else _progress_printer()

    def sink(event: "Event") -> None:
        if progress and event.kind == "info" and "collector" in event.data:
            progress("collected", event.data["collector"], event.data["done"], event.data["total"])
    try:
        outcome = run(playbook, settings, sink=sink)
    finally:
        if progress:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
    if "error" in outcome.data:
        raise outcome.data["error"]
    if "result" not in outcome.data:
        failed = next((e.message for e in outcome.events if e.kind == "step_failed"), "collection failed")
        raise GpuwardenError(f"bundle: {failed}", "see the journal (`gpuwarden journal`) for details")
    result = outcome.data["result"]
    if json_out:
        sys.stdout.write(json.dumps(document("bundle", result.to_dict()), indent=2, default=str) + "\n")
    else:
        _print_result(result)
