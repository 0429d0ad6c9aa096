"""CLI: `gpuwarden sim ...` — create and drive the simulated node used for demos, CI and drills.

The sim node is a fake amdgpu/KFD tree in the state dir; tenants are real processes.
"""

from __future__ import annotations

import json
from typing import List

import typer

from ops.settings import Settings
from ops.units import fmt_bytes, parse_size

sim_app = typer.Typer(help="The simulated node: a fake amdgpu/KFD node in the state dir for demos, tests and drills.",
                      no_args_is_help=True)


@sim_app.command("init")
def init_cmd(
    ctx: typer.Context,
    gpus: int = typer.Option(4, "--gpus", help="Number of simulated GPUs."),
    vram: str = typer.Option("24GiB", "--vram", help="VRAM per GPU, e.g. 24GiB or 192GiB."),
    hive: bool = typer.Option(False, "--hive", help="Put all GPUs in one XGMI hive (a reset reaches them all)."),
    force: bool = typer.Option(False, "--force", help="Start over even if simulated tenants hold memory."),
) -> None:
    """Create (or recreate) the simulated node in the state dir."""
    from ops.sim.node import SimNode
    settings: Settings = ctx.obj
    node = SimNode(settings.state_dir)
    node.init(gpus=gpus, vram=parse_size(vram), hive=hive, force=force)
    typer.echo(f"simulated node: {gpus} GPU(s) of {fmt_bytes(parse_size(vram))} in {node.dir}")
    typer.echo("use it with --backend sim (or GPUWARDEN_BACKEND=sim)")


@sim_app.command("hold")
def hold_cmd(
    ctx: typer.Context,
    gpu: List[int] = typer.Option(..., "--gpu", help="GPU index to allocate on (repeat for several)."),
    size: str = typer.Option("1GiB", "--size", help="VRAM to hold on each GPU."),
) -> None:
    """Run a simulated tenant: hold VRAM and the GPU device files until SIGTERM/Ctrl-C."""
    from ops.sim.tenant import hold
    settings: Settings = ctx.obj
    raise typer.Exit(hold(settings.state_dir, list(gpu), parse_size(size)))


@sim_app.command("fault")
def fault_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="leak-on-kill (a killed tenant's VRAM stays, ownerless) or "
                                         "reset-fails (the next reset fails) or hang (every driver read blocks until it is "
                                         "turned off: a wedged GPU, for the agent's stale drill)."),
    state: str = typer.Argument("on", help="on or off"),
) -> None:
    """Switch a fault of the simulated driver on or off."""
    from ops.errors import GpuwardenError
    from ops.sim.node import SimNode
    if state not in ("on", "off"):
        raise GpuwardenError(f"fault state must be on or off, not {state!r}")
    SimNode(ctx.obj.state_dir).set_fault(name, state == "on")
    typer.echo(f"fault {name}: {state}")


@sim_app.command("leak")
def leak_cmd(
    ctx: typer.Context,
    gpu: int = typer.Option(..., "--gpu", help="GPU index."),
    size: str = typer.Option(..., "--size", help="Ownerless VRAM to leave behind, e.g. 14GiB."),
) -> None:
    """Leave ownerless residual VRAM on a simulated GPU (only a reset clears it)."""
    from ops.sim.node import SimNode
    SimNode(ctx.obj.state_dir).leak(gpu, parse_size(size))
    typer.echo(f"GPU {gpu}: {size} leaked")


@sim_app.command("show")
def show_cmd(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the simulated node's configuration, faults, leaks and allocations."""
    from ops.sim.node import SimNode
    info = SimNode(ctx.obj.state_dir).describe()
    if json_out:
        from ops.jsondoc import document
        typer.echo(json.dumps(document("sim-node", info), indent=2))
        return
    typer.echo(f"{info['gpus']} GPU(s) x {fmt_bytes(info['vram'])} in {info['dir']}"
               + ("  (one XGMI hive)" if info["hive"] else ""))
    typer.echo(f"faults: {', '.join(info['faults']) or 'none'}")
    for g, b in sorted(info["leaked"].items()):
        typer.echo(f"leaked on GPU {g}: {fmt_bytes(b)}")
    for a in info["allocations"]:
        typer.echo(f"pid {a['pid']} GPU {a['gpu']}: {fmt_bytes(a['bytes'])}")


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
