"""CLI: `gpuwarden config` — check the node config, print complete examples to start from.

`config check` exits 0 with a summary, or 2 with one line naming the file, line and key.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.jsondoc import document
from gpuwarden.ops.config import reference
from gpuwarden.ops.foundation import redact

FOUR_ENGINES = reference.example(4)  # generated from ops/config/keys.py, as docs/configuration.md's tables

CANARY = '''\
# A canary per GPU: maps and verifies the arena, registers it, copies it to the GPU, serves until stopped.
# The canary speaks the status protocol and takes a gate slot around its register call itself.
# --runtime {runtime}: {runtime_note}

[arena]
path = "/dev/shm/canary.arena"
size = "{size}"

[stagger]
slots = 1
registration_timeout = 300

[defaults]
progress = "status"
stop_grace = 30
restart = "no"

# Inside an engine its one GPU is device 0 (the shim restricts visibility), hence --gpu 0.
# The shim runs argv as given: `gpuwarden` must be on its PATH (activate the venv), or give the full path.
[[engines]]
name = "canary0"
gpu = 0
argv = ["gpuwarden", "canary", "--arena", "/dev/shm/canary.arena", "--gpu", "0", "--runtime", "{runtime}"]

[[engines]]
name = "canary1"
gpu = 1
argv = ["gpuwarden", "canary", "--arena", "/dev/shm/canary.arena", "--gpu", "0", "--runtime", "{runtime}"]
'''

RUNTIMES = {
    "hip": ("AMD GPUs through hip-python", "32GiB"),
    "cuda": ("NVIDIA GPUs through cuda-bindings (pip install -e '.[cuda]')", "32GiB"),
    "host": ("no GPU: pins the arena with mlock (needs RLIMIT_MEMLOCK)", "1GiB"),
    "sim": ("the simulated node (no GPU); hip on AMD, cuda on NVIDIA", "256MiB"),
}


def canary_example(runtime: str) -> str:
    note, size = RUNTIMES[runtime]
    return CANARY.format(runtime=runtime, runtime_note=note, size=size)


config_app = typer.Typer(help="The node config: check it, print examples.", no_args_is_help=True,
                         rich_markup_mode=None)


@config_app.command("check")
def check_cmd(ctx: typer.Context,
              json_out: bool = typer.Option(False, "--json", help="Print the parsed config as JSON (secrets redacted)."),
              node: bool = typer.Option(True, "--node/--no-node",
                                        help="Also check each engine's GPU index against this node's GPUs."),
              config: Optional[Path] = typer.Option(None, "--config", metavar="PATH", readable=False,
                                                    help="The file to check (the same as gpuwarden --config PATH "
                                                         "before the command).")) -> None:
    """Parse and validate the node config (--config, default /etc/gpuwarden/node.toml).

    Exit 0 with a summary when it is valid; exit 2 when it is not, with one line per error that names the
    file, the line and the key, and says what is expected (every error, not only the first).
    """
    # deferred: keeps `gpuwarden config --help` cheap (13.1 ms there); only this path of the command needs it
    from gpuwarden.ops.config import nodeconfig
    settings: Settings = ctx.obj
    if config is not None:
        settings = settings.with_(config_path=config)
    gpus, note = _node_gpus(settings) if node else (None, None)
    # The engines' GPUs are checked with every other key: `gpu = 7` is not saved for after the others are fixed.
    cfg = nodeconfig.load(settings, gpu_count=gpus)
    if json_out:
        sys.stdout.write(json.dumps(document("config", {
            "path": str(cfg.path), "state_dir": str(cfg.state_dir) if cfg.state_dir else None,
            "arena": cfg.arena.__dict__ if cfg.arena else None, "stagger": cfg.stagger.__dict__,
            "engines": [{**e.to_dict(), "argv": redact.redact_argv(e.argv)[0], "env": redact.env_mapping(e.env)}
                        for e in cfg.engines],
            "agent": cfg.agent.to_dict(), "gpus_checked": note is None and node}), indent=2) + "\n")
        return
    typer.echo(f"{printable(str(cfg.path))}: ok")
    if cfg.arena:
        typer.echo(f"  arena   {printable(cfg.arena.path)}" + (f"  {fmt_bytes(cfg.arena.size)}" if cfg.arena.size else ""))
    typer.echo(f"  stagger {cfg.stagger.slots} registering at once, timeout {cfg.stagger.registration_timeout:.0f}s")
    for e in cfg.engines:
        gpu = "all GPUs" if e.gpu is None else f"GPU {e.gpu}"
        follow = {"status": "status protocol", "preload": f"interposer, gate until {e.gate_release}"}.get(
            e.progress, f"log /{printable(e.registered_pattern or '')}/")
        typer.echo(f"  engine  {e.name:<12} {gpu:<8} {follow}, restart {e.restart}: "
                   f"{printable(redact.command_line(e.argv))}")
    if cfg.kubernetes is not None:
        k = cfg.kubernetes
        rem = (f"remediation after {k.remediate_after:g}s ({k.remediation_slots} node(s) of the cluster at once, "
               f"once per {k.remediation_interval:g}s)" if k.remediate else "remediation off")
        typer.echo(f"  kubernetes policy {k.policy}, taint after {k.taint_after:g}s, {rem}")
    if note:
        typer.echo(f"  note: {note}")


def _node_gpus(settings: Settings) -> tuple[int | None, str | None]:
    """How many GPUs this node has (None and why when no backend can tell; the simulated node counts
    only when chosen with --backend sim)."""
    # deferred: keeps `gpuwarden config --help` cheap (11.2 ms there); only this path of the command needs it
    from gpuwarden.ops.node.sim.node import SimNode
    if settings.backend == "sim":
        sim = SimNode(settings.state_dir)
        if not sim.exists:
            return None, "GPU indexes not checked: no simulated node in the state dir (`gpuwarden sim init`)"
        return sim.config()["gpus"], None
    # deferred: keeps `gpuwarden config --help` cheap (1.9 ms there); only this path of the command needs it
    from gpuwarden.ops.node.backends.select import open_backend
    try:
        backend = open_backend(settings)
    except GpuwardenError as exc:
        return None, f"GPU indexes not checked: {exc.message}"
    try:
        return len(list(backend.gpus())), None
    finally:
        close = getattr(backend, "close", None)
        if close:
            close()


@config_app.command("example")
def example_cmd(canary: bool = typer.Option(False, "--canary", help="The canary example instead of four engines."),
                runtime: str = typer.Option("hip", "--runtime", metavar="hip|cuda|host|sim",
                                            help="With --canary: how the canaries register (sim runs anywhere).")) \
        -> None:
    """Print a complete, commented node config to start from (four engines on four GPUs, or canaries).

    Its keys and comments come from the same table as the reference in docs/configuration.md."""
    if runtime not in RUNTIMES:
        raise GpuwardenError(f"unknown runtime {runtime!r}", f"choose one of: {', '.join(RUNTIMES)}")
    sys.stdout.write(canary_example(runtime) if canary else FOUR_ENGINES)
