"""CLI: `gpuwarden sim ...` — create and drive the simulated node used for demos, CI and drills.

The sim node is a fake amdgpu/KFD tree in the state dir; tenants are real processes.
"""

from __future__ import annotations

import json
from typing import List, Optional

import typer
from gpuwarden.playbooks.cli.commands.playbook_options import COUNT, GPU_INDEX

from gpuwarden.playbooks.cli.commands import completion

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes, parse_size
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.jsondoc import document, dumps
from gpuwarden.playbooks.cli.hints import Invocation

sim_app = typer.Typer(help="The simulated node: a fake amdgpu/KFD node in the state dir for demos, tests and drills.",
                      no_args_is_help=True, rich_markup_mode=None)


@sim_app.command("init")
def init_cmd(
    ctx: typer.Context,
    gpus: int = typer.Option(4, "--gpus", parser=COUNT, help="Number of simulated GPUs (1 to 64)."),
    vram: str = typer.Option("24GiB", "--vram", help="VRAM per GPU, e.g. 24GiB or 192GiB (64MiB to 16TiB)."),
    hive: bool = typer.Option(False, "--hive", help="Put all GPUs in one XGMI hive (a reset reaches them all)."),
    force: bool = typer.Option(False, "--force", help="Start over even if simulated tenants hold memory."),
    partition: str = typer.Option("SPX", "--partition", help="MI300 compute partition mode: SPX, DPX (2 logical "
                                  "GPUs per device), QPX (4) or CPX (8); --gpus counts the logical GPUs."),
) -> None:
    """Create (or recreate) the simulated node in the state dir.

    Every value is checked first: a refused init leaves an existing node exactly as it was."""
    # deferred: keeps `gpuwarden sim --help` cheap (8.7 ms there)
    from gpuwarden.ops.node.sim.node import SimNode
    settings: Settings = ctx.obj
    node = SimNode(settings.state_dir)
    node.init(gpus=gpus, vram=parse_size(vram), hive=hive, force=force, partition=partition.upper())
    typer.echo(f"simulated node: {gpus} GPU(s) of {fmt_bytes(parse_size(vram))} in {node.dir}")
    typer.echo("use it with --backend sim (or GPUWARDEN_BACKEND=sim)")


@sim_app.command("hold")
def hold_cmd(
    ctx: typer.Context,
    gpu: List[int] = typer.Option(..., "--gpu", parser=GPU_INDEX, help="GPU index to allocate on (repeat for several)."),
    size: str = typer.Option("1GiB", "--size", help="VRAM to hold on each GPU."),
    busy: Optional[float] = typer.Option(None, "--busy", min=0, max=100,
                                         help="Keep each GPU's gfx engine busy this percent of the time (its DRM "
                                              "client's fdinfo engine time grows at that rate: the GPU% column)."),
) -> None:
    """Run a simulated tenant: hold VRAM and the GPU device files until SIGTERM/Ctrl-C."""
    # deferred: keeps `gpuwarden sim --help` cheap (8.6 ms there)
    from gpuwarden.ops.node.sim.tenant import hold
    settings: Settings = ctx.obj
    nbytes = parse_size(size)
    if nbytes <= 0:  # a tenant of 0 bytes holds nothing to see: refused, as `sim leak` refuses it
        raise GpuwardenError(f"a simulated tenant must hold more than 0 bytes, not {size}", "e.g. --size 1GiB")
    raise typer.Exit(hold(settings.state_dir, list(gpu), nbytes,
                          busy=None if busy is None else busy / 100))


@sim_app.command("fault")
def fault_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="leak-on-kill (a killed tenant's VRAM stays, ownerless) or "
                                         "reset-fails (the next reset fails) or hang (reads of busy, temperature and "
                                         "power block in the kernel until it is turned off: a wedged GPU, for the "
                                         "deadline and stale drills)."),
    state: str = typer.Argument("on", help="on or off"),
    gpu: List[int] = typer.Option([], "--gpu", parser=GPU_INDEX, help="hang only: wedge this GPU (repeat for several; default all)."),
) -> None:
    """Switch a fault of the simulated driver on or off."""
    # deferred: keeps `gpuwarden sim --help` cheap (8.7 ms there)
    from gpuwarden.ops.node.sim.node import SimNode
    if state not in ("on", "off"):
        raise GpuwardenError(f"fault state must be on or off, not {state!r}")
    SimNode(ctx.obj.state_dir).set_fault(name, state == "on", list(gpu) or None)
    typer.echo(f"fault {name}: {state}" + (f" (GPU {', '.join(map(str, gpu))})" if gpu and state == "on" else ""))


@sim_app.command("leak")
def leak_cmd(
    ctx: typer.Context,
    gpu: int = typer.Option(..., "--gpu", parser=GPU_INDEX, help="GPU index."),
    size: str = typer.Option(..., "--size", help="Ownerless VRAM to leave behind, e.g. 14GiB."),
) -> None:
    """Leave ownerless residual VRAM on a simulated GPU (only a reset clears it)."""
    # deferred: keeps `gpuwarden sim --help` cheap (8.7 ms there)
    from gpuwarden.ops.node.sim.node import SimNode
    nbytes = parse_size(size)
    SimNode(ctx.obj.state_dir).leak(gpu, nbytes)
    typer.echo(f"GPU {gpu}: {fmt_bytes(nbytes)} leaked (ownerless: only a reset clears it)")


@sim_app.command("show")
def show_cmd(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the simulated node's configuration, faults, leaks and allocations."""
    # deferred: keeps `gpuwarden sim --help` cheap (8.7 ms there)
    from gpuwarden.ops.node.sim.node import SimNode
    info = SimNode(ctx.obj.state_dir).describe()
    if json_out:
        typer.echo(json.dumps(document("sim-node", info), indent=2))
        return
    typer.echo(f"{info['gpus']} GPU(s) x {fmt_bytes(info['vram'])} in {info['dir']}"
               + ("  (one XGMI hive)" if info["hive"] else ""))
    typer.echo(f"faults: {', '.join(info['faults']) or 'none'}")
    for g, b in sorted(info["leaked"].items()):
        typer.echo(f"leaked on GPU {g}: {fmt_bytes(b)}")
    for a in info["allocations"]:
        typer.echo(f"pid {a['pid']} GPU {a['gpu']}: {fmt_bytes(a['bytes'])}")


@sim_app.command("scenario")
def scenario_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="residual, arena or clean.", metavar="NAME",
                               autocompletion=completion.choices("residual", "arena", "clean")),
    json_out: bool = typer.Option(False, "--json", help="Print what was set up as JSON."),
) -> None:
    """Set the simulated node up as one of the README's incidents, to see and fix it (or clean it).

    residual: a tenant killed while the driver leaked its memory left 14 GiB on GPU 2 that no process
    owns, and a worker killed under a parent that never reaps it is a zombie holding 2 GiB on GPU 1
    (then: `gpuwarden status`, `gpuwarden fix 1`, `gpuwarden fix 2`).
    arena: the arena incident through the real launch playbook: four canaries register one arena (every
    registration succeeds, the simulated KFD ledger ends near its limit), then each one's next pinned
    allocation fails and all four die of SIGSEGV, with an incident bundle (then: `gpuwarden engines list`,
    `gpuwarden triage BUNDLE`).
    clean: ends what an earlier scenario started and starts the simulated node over, empty.
    Every scenario first does what clean does. See it with --backend sim (or GPUWARDEN_BACKEND=sim): no
    command falls back to the simulated node by itself.
    """
    # deferred: keeps `gpuwarden sim --help` cheap (54.6 ms there); only this path of the command needs it
    from gpuwarden.playbooks import scenarios
    if name not in scenarios.SCENARIOS:
        raise GpuwardenError(f"unknown scenario {name!r}", f"choose one of: {', '.join(scenarios.SCENARIOS)}")
    settings: Settings = ctx.obj
    if settings.backend not in (None, "sim"):
        raise GpuwardenError(f"scenarios run on the simulated node, not on --backend {settings.backend}",
                             "pass --backend sim")
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if not json_out:
            typer.echo(f"  {line}")

    extra = getattr(scenarios, name)(settings, say) or {}
    if json_out:
        typer.echo(dumps(document("sim-scenario", {"scenario": name, "lines": said, **extra})))
        return
    nxt = {"residual": "see it with `gpuwarden status`, fix it with `gpuwarden fix 1` and `gpuwarden fix 2`",
           "arena": "see it with `gpuwarden engines list` or in the console (`gpuwarden tui`)",
           "clean": "the simulated node is empty"}[name]
    # No command falls back to the simulated node by itself (ops/node/backends/select.py): the commands to paste
    # name it when this one was not given --backend sim.
    words = list(settings.cli_words) if settings.backend == "sim" else ["--backend", "sim", *settings.cli_words]
    typer.echo(f"scenario {name}: ready; " + (Invocation(words).paste_ready(nxt) or nxt))
