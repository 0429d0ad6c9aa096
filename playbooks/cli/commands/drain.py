"""CLI: `gpuwarden drain GPU` and `gpuwarden undrain GPU` — take a GPU out of service and put it back.

Plan first with --dry-run; scripts pass --yes; --json prints one event per line.
"""

from __future__ import annotations

from typing import Optional

import typer

from gpuwarden.ops.foundation import extras
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.cli.commands import completion
from gpuwarden.playbooks.cli.commands.playbook_options import DryRun, GPU_INDEX, JsonOut, Wait, Yes
from gpuwarden.ops.config.loader import kubernetes_config as for_settings


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("drain")
def drain_cmd(
    ctx: typer.Context,
    gpu: int = typer.Argument(..., parser=GPU_INDEX, help="GPU index (see `gpuwarden status`).",
                             autocompletion=completion.gpus),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait until the GPU is idle."),
    grace: Optional[float] = typer.Option(None, "--grace", help="Seconds each engine gets between its stop "
                                          "signal and SIGKILL (default: the engine's stop_grace)."),
    reason: str = typer.Option("", "--reason", help="Why, for the journal and `status`."),
    kubernetes: bool = typer.Option(False, "--kubernetes", help="First evict the pods holding the GPU through "
                                    "the Eviction API (PodDisruptionBudgets respected; --grace is their "
                                    "termination grace) and cordon the node."),
    cordon: bool = typer.Option(True, "--cordon/--no-cordon", help="With --kubernetes: cordon the node so "
                                "evicted pods are placed elsewhere (undrain lifts only a cordon it set)."),
    eviction_timeout: float = typer.Option(120.0, "--eviction-timeout", help="With --kubernetes: seconds to "
                                           "keep retrying an eviction a PodDisruptionBudget refuses."),
    node_name: Optional[str] = typer.Option(None, "--node-name", help="With --kubernetes: this node's name "
                                            "(default: [kubernetes] node_name, NODE_NAME, the host name)."),
    dry_run: DryRun = False,
    yes: Yes = False,
    json_out: JsonOut = False,
    wait: Wait = 0.0,
) -> None:
    """Drain GPU N: mark it drained, stop the engines on it, wait until it is idle.

    Launch refuses a drained GPU and status shows it. Engines on this GPU only are stopped through
    their shims (stop signal, grace, SIGKILL); then drain waits until no process holds the GPU and its
    VRAM is back at the baseline, and reports what was stopped and what remains. Memory that no process
    holds never comes back by itself: once nothing else is left, drain stops waiting for it, exits 0 and
    names the reset (`gpuwarden reset N`, or `gpuwarden fix N`). Exit 1 when a process still uses or
    holds the GPU (purge removes dead holders).
    """
    # deferred: keeps `gpuwarden drain --help` cheap (4.2 ms there); only this path of the command needs it
    from gpuwarden.playbooks import nodecheck
    # deferred: keeps `gpuwarden drain --help` cheap (27.2 ms there)
    from gpuwarden.playbooks.drain import DrainPlaybook
    # deferred: keeps `gpuwarden drain --help` cheap (11.3 ms there)
    from gpuwarden.playbooks.cli.output import execute, exit_with
    settings: Settings = ctx.obj
    if kubernetes:  # before anything is read: a missing client is the first thing to say
        extras.need("kubernetes", f"{ctx.info_name} --kubernetes")
    nodecheck.require_gpu(nodecheck.snapshot(settings), gpu)
    if kubernetes:
        # deferred: keeps `gpuwarden drain --help` cheap (8.6 ms there)
        from gpuwarden.ops.k8s.kube import connect
        # deferred: keeps `gpuwarden drain --help` cheap (39.5 ms there)
        from gpuwarden.playbooks.k8s_drain import KubernetesDrainPlaybook
        cfg = for_settings(settings, node_name=node_name)
        pb = KubernetesDrainPlaybook(gpu, node_name=cfg.resolved_node_name(), kube_factory=lambda: connect(cfg.kubeconfig),
                                     cordon=cordon, eviction_timeout_s=eviction_timeout,
                                     pod_resources_socket=cfg.pod_resources_socket,
                                     timeout_s=timeout, grace_s=grace, reason=reason)
    else:
        pb = DrainPlaybook(gpu, timeout_s=timeout, grace_s=grace, reason=reason)
    exit_with(execute(pb, settings, dry_run=dry_run, yes=yes, json_out=json_out, wait_s=wait))

@cli.command("undrain")
def undrain_cmd(
    ctx: typer.Context,
    gpu: int = typer.Argument(..., parser=GPU_INDEX, help="GPU index.", autocompletion=completion.gpus),
    dry_run: DryRun = False,
    yes: bool = typer.Option(False, "--yes", "-y", help="Accepted for symmetry; undrain asks nothing."),
    kubernetes: bool = typer.Option(False, "--kubernetes", help="Also uncordon the node, only if "
                                    "`drain --kubernetes` cordoned it and no other GPU is drained."),
    node_name: Optional[str] = typer.Option(None, "--node-name", help="With --kubernetes: this node's name."),
    json_out: JsonOut = False,
    wait: Wait = 0.0,
) -> None:
    """Undrain GPU N: clear its drained mark so launch may use it again."""
    # deferred: keeps `gpuwarden drain --help` cheap (4.2 ms there); only this path of the command needs it
    from gpuwarden.playbooks import nodecheck
    # deferred: keeps `gpuwarden drain --help` cheap (28.1 ms there)
    from gpuwarden.playbooks.drain import UndrainPlaybook
    # deferred: keeps `gpuwarden drain --help` cheap (11.3 ms there)
    from gpuwarden.playbooks.cli.output import execute, exit_with
    settings: Settings = ctx.obj
    if kubernetes:  # before anything is read: a missing client is the first thing to say
        extras.need("kubernetes", f"{ctx.info_name} --kubernetes")
    nodecheck.require_gpu(nodecheck.snapshot(settings), gpu)
    pb = UndrainPlaybook(gpu)
    if kubernetes:
        # deferred: keeps `gpuwarden drain --help` cheap (8.6 ms there)
        from gpuwarden.ops.k8s.kube import connect
        # deferred: keeps `gpuwarden drain --help` cheap (41.4 ms there)
        from gpuwarden.playbooks.k8s_drain import KubernetesUndrainPlaybook
        cfg = for_settings(settings, node_name=node_name)
        pb = KubernetesUndrainPlaybook(gpu, node_name=cfg.resolved_node_name(),
                                       kube_factory=lambda: connect(cfg.kubeconfig))
    exit_with(execute(pb, settings, dry_run=dry_run, yes=yes, json_out=json_out, wait_s=wait))
