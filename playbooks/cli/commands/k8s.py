"""CLI for Kubernetes tenants: `gpu-check` (an init container's gate) and `post-clean` (a preStop hook).

The node's side (condition, taint, pod names, AMD device-plugin health) is `gpuwarden agent --kubernetes`.
"""

from __future__ import annotations

from typing import List, Optional

import typer
from gpuwarden.playbooks.cli.commands.playbook_options import GPU_INDEX

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.jsondoc import document, dumps
from gpuwarden.playbooks.cli.hints import Invocation


cli = typer.Typer(rich_markup_mode=None)  # this module's commands: the root loads it only when one is named


@cli.command("gpu-check")
def gpu_check_cmd(
    ctx: typer.Context,
    gpus: Optional[List[int]] = typer.Argument(None, parser=GPU_INDEX, help="GPU indexes (default: this pod's GPUs, else those "
                                               "ROCR/CUDA/HIP_VISIBLE_DEVICES name, else every GPU)."),
    json_out: bool = typer.Option(False, "--json", help="Print the verdict as JSON (gpuwarden.gpu-check/1)."),
    no_agent: bool = typer.Option(False, "--no-agent", help="Sample the node here instead of asking the agent."),
    node: bool = typer.Option(False, "--node", help="The whole node, as node-problem-detector's custom plugin: "
                              "one line (at most 80 bytes), exit 0 clean, 1 a GPU is not, 2 unknown."),
    gate_url: Optional[str] = typer.Option(None, "--gate-url", envvar="GPUWARDEN_GATE_URL",
                                           help="Ask the node's agent over the network (its gpu-check gate, e.g. "
                                           "http://$(HOST_IP):9836) about the GPUs the kubelet gave this pod: "
                                           "what the unprivileged init container of the admission policies runs."),
    token_file: str = typer.Option("/var/run/secrets/gpuwarden/token", "--token-file",
                                   help="With --gate-url: the pod's projected service-account token (audience "
                                   "gpuwarden) that proves to the agent which pod asks."),
) -> None:
    """Are these GPUs fit for a new tenant? For an init container: exit 0 clean, 1 not (with the reason).

    Asks the agent over its socket (<state dir>/agent.sock: mount the agent's state dir into the pod) and
    falls back to sampling the node itself. With --gate-url (what the admission policies inject) it asks the
    node's agent over the network instead, as an unprivileged container with no GPU: one line, exit 0 clean,
    1 not clean or refused, 2 no token or no answer. A GPU is not clean when it holds residual VRAM, a
    dead holder keeps it, or it is drained.
    """
    if gate_url:
        if gpus or node or no_agent:
            raise typer.BadParameter("--gate-url asks about this pod's own GPUs: name no GPU, no --node, no "
                                     "--no-agent with it")
        # deferred: keeps `gpuwarden gpu-check --help` cheap (28.1 ms there); only this path of the command needs it
        from gpuwarden.ops.k8s.gateclient import ask
        code, line = ask(gate_url, token_file)
        if json_out:
            typer.echo(dumps(document("gpu-check", {"ok": code == 0, "source": "gate", "line": line})))
        else:
            typer.echo(line, err=code != 0)
        raise typer.Exit(code)
    # deferred: keeps `gpuwarden gpu-check --help` cheap (4.1 ms there); only this path of the command needs it
    from gpuwarden.ops.k8s.gpucheck import check, choose_gpus, own_pod_uid
    settings: Settings = ctx.obj
    if node:
        # deferred: keeps `gpuwarden gpu-check --help` cheap (19.2 ms there); only this path of the command needs it
        from gpuwarden.playbooks.nodecheck_npd import node_check
        if gpus:
            raise typer.BadParameter("--node checks every GPU of the node: name no GPU with it")
        code, line = node_check(settings, use_agent=not no_agent)
        typer.echo(line)
        raise typer.Exit(code)
    if no_agent:
        # deferred: keeps `gpuwarden gpu-check --help` cheap (5.5 ms there); only this path of the command needs it
        from gpuwarden.ops.sampling.sampler import take_snapshot
        snap, source = take_snapshot(settings), "sampled here"
    else:
        # deferred: keeps `gpuwarden gpu-check --help` cheap (3.4 ms there); only this path of the command needs it
        from gpuwarden.ops.sources.choose import AGENT, ONCE, choose
        chosen_source = choose(settings, ONCE)  # the agent's latest when it answers, else sampled here
        try:
            snap = chosen_source.snapshot(deep=True)
            source = "agent" if chosen_source.kind == AGENT else "sampled here"
        finally:
            chosen_source.close()
    chosen, why = choose_gpus(snap, list(gpus or []), pod_uid=own_pod_uid(settings.proc_root))
    verdicts = check(snap, chosen)
    ok = all(v.ok for v in verdicts)
    if json_out:
        typer.echo(dumps(document("gpu-check", {"ok": ok, "source": source, "chosen_by": why,
                                                "gpus": [v.to_dict() for v in verdicts]})))
    else:
        for v in verdicts:
            typer.echo(f"GPU {v.gpu}: " + ("clean" if v.ok else "NOT CLEAN — " + "; ".join(v.reasons)),
                       err=not v.ok)
        if not ok:
            line = ("gpu-check: a GPU is not fit for a new tenant (ask the operator: `gpuwarden status`, "
                    + ", ".join(_remedy(v) for v in verdicts if not v.ok) + ")")
            typer.echo(Invocation(list(settings.cli_words)).paste_ready(line), err=True)
    raise typer.Exit(0 if ok else 1)

@cli.command("post-clean")
def post_clean_cmd(
    ctx: typer.Context,
    gpus: Optional[List[int]] = typer.Argument(None, parser=GPU_INDEX, help="GPU indexes (default: the GPUs the pod's processes "
                                               "use, else every GPU)."),
    pod_uid: Optional[str] = typer.Option(None, "--pod-uid", help="The pod to wait for (default: the pod this "
                                          "command runs in, from /proc/self/cgroup)."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the pod's processes to go."),
    grace: float = typer.Option(5.0, "--grace", help="Purge: seconds between SIGTERM and SIGKILL."),
    json_out: bool = typer.Option(False, "--json", help="One JSON event per line (the purge's events)."),
) -> None:
    """For a preStop hook: wait until the pod's processes leave its GPUs, then purge what they left.

    Runs unattended (no question asked) through the purge playbook with all its guards: PID + start
    time checked before any signal, other users' and system processes never touched, every step in the
    journal. Needs the host's PID namespace and root, as the agent's DaemonSet has. Exit 0 clean, 1 when
    something stays (named), 2 on error.
    """
    # deferred: keeps `gpuwarden gpu-check --help` cheap (4.1 ms there); only this path of the command needs it
    from gpuwarden.ops.k8s.gpucheck import own_pod_uid
    # deferred: keeps `gpuwarden gpu-check --help` cheap (12.0 ms there)
    from gpuwarden.ops.k8s.postclean import wait_pod_gone
    # deferred: keeps `gpuwarden gpu-check --help` cheap (5.5 ms there)
    from gpuwarden.ops.sampling.sampler import take_snapshot
    # deferred: keeps `gpuwarden gpu-check --help` cheap (14.3 ms there)
    from gpuwarden.playbooks.cli.output import event_printer
    # deferred: keeps `gpuwarden gpu-check --help` cheap (13.9 ms there)
    from gpuwarden.playbooks.framework import run
    # deferred: keeps `gpuwarden gpu-check --help` cheap (32.0 ms there)
    from gpuwarden.playbooks.purge import PurgePlaybook
    settings: Settings = ctx.obj
    uid = pod_uid or own_pod_uid(settings.proc_root)
    if not uid:
        raise GpuwardenError("post-clean: this process is not in a pod's cgroup",
                             "run it as the pod's preStop hook, or name the pod with --pod-uid")
    say = (lambda m: None) if json_out else (lambda m: typer.echo(f"post-clean: {m}", err=True))
    snap, left = wait_pod_gone(lambda: take_snapshot(settings), uid, list(gpus) if gpus else None,
                               settings.proc_root, timeout, say)
    if left:
        typer.echo(f"post-clean: pod {uid} still runs on its GPUs after {timeout:g}s: "
                   + ", ".join(f"pid {p.pid}" for p in left) + "; nothing purged", err=True)
        raise typer.Exit(1)
    targets = list(gpus) if gpus else sorted(r.gpu_index for r in snap.residual if r.significant or r.holders)
    if not targets:
        say("the pod's processes are gone and no GPU holds residual VRAM: nothing to purge")
        raise typer.Exit(0)
    code = 0
    for g in targets:
        result = run(PurgePlaybook(g, grace_s=grace), settings, sink=event_printer(json_out, settings.cli_words),
                     assume_yes=True)
        code = max(code, result.exit_code)
    raise typer.Exit(code)


def _remedy(verdict) -> str:
    """What clears one GPU's verdict: `fix` for residual VRAM (purge alone only verifies an ownerless leak; fix
    resets it when that is the only way), `undrain` for a GPU that is only drained."""
    if all(r.startswith("drained") for r in verdict.reasons):
        return f"`gpuwarden undrain {verdict.gpu}`"
    return f"`gpuwarden fix {verdict.gpu}`"
