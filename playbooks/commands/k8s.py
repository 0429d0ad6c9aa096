"""CLI for Kubernetes nodes: `gpu-check` (an init container's gate), `post-clean` (a preStop hook) and
`k8s-agent` (the node condition/taint, pod names, AMD device-plugin health, until the agent runs it).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from ops.settings import Settings


def register(app: typer.Typer) -> None:
    @app.command("gpu-check")
    def gpu_check_cmd(
        ctx: typer.Context,
        gpus: Optional[List[int]] = typer.Argument(None, help="GPU indexes (default: this pod's GPUs, else those "
                                                   "ROCR/CUDA/HIP_VISIBLE_DEVICES name, else every GPU)."),
        json_out: bool = typer.Option(False, "--json", help="Print the verdict as JSON (gpuwarden.gpu-check/1)."),
        no_agent: bool = typer.Option(False, "--no-agent", help="Sample the node here instead of asking the agent."),
    ) -> None:
        """Are these GPUs fit for a new tenant? For an init container: exit 0 clean, 1 not (with the reason).

        Asks the agent over its socket (<state dir>/agent.sock, or GPUWARDEN_AGENT_SOCKET; mount it into the
        pod) and falls back to sampling the node itself. A GPU is not clean when it holds residual VRAM, a
        dead holder keeps it, or it is drained.
        """
        from ops.jsondoc import document, dumps
        from ops.k8s import agentlink
        from ops.k8s.gpucheck import check, choose_gpus, own_pod_uid
        settings: Settings = ctx.obj
        snap = None if no_agent else agentlink.ask(settings.state_dir)
        source = "agent"
        if snap is None:
            from ops.snapshot import take_snapshot
            snap, source = take_snapshot(settings), "sampled here"
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
                typer.echo("gpu-check: a GPU is not fit for a new tenant (ask the operator: `gpuwarden status`, "
                           "`gpuwarden purge N`)", err=True)
        raise typer.Exit(0 if ok else 1)

    @app.command("post-clean")
    def post_clean_cmd(
        ctx: typer.Context,
        gpus: Optional[List[int]] = typer.Argument(None, help="GPU indexes (default: the GPUs the pod's processes "
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
        from ops.errors import GpuwardenError
        from ops.k8s.gpucheck import own_pod_uid
        from ops.k8s.postclean import wait_pod_gone
        from ops.snapshot import take_snapshot
        from playbooks.output import event_printer
        from playbooks.framework import run
        from playbooks.purge import PurgePlaybook
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
            result = run(PurgePlaybook(g, grace_s=grace), settings, sink=event_printer(json_out), assume_yes=True)
            code = max(code, result.exit_code)
        raise typer.Exit(code)

    @app.command("k8s-agent")
    def k8s_agent_cmd(
        ctx: typer.Context,
        node_name: Optional[str] = typer.Option(None, "--node-name", help="This node's name (default: [kubernetes] "
                                                "node_name, NODE_NAME, the host name)."),
        policy: Optional[str] = typer.Option(None, "--policy", help="taint (condition and taint, the default), "
                                             "condition (the condition only) or off."),
        taint_after: Optional[str] = typer.Option(None, "--taint-after", help="How long residual VRAM must last "
                                                  "before the taint, e.g. 2m (default [kubernetes] taint_after, 2m)."),
        health: Optional[bool] = typer.Option(None, "--health/--no-health", help="Serve AMD's per-GPU health "
                                              "service for the device plugin (opt-in)."),
        health_socket: Optional[str] = typer.Option(None, "--health-socket", help="Its unix socket path."),
        interval: float = typer.Option(1.0, "--interval", min=0.1, help="Seconds between samples."),
    ) -> None:
        """Keep the node's condition GPUResidualVRAM and taint gpuwarden.io/gpu-unhealthy current.

        Samples the node, names pods on processes and holders (cgroup + the API's pods on this node), posts
        Events for purges/resets/drains and taint changes, and serves the last snapshot on <state dir>/agent.sock
        for `gpu-check`. In-cluster credentials, else KUBECONFIG. Runs until SIGTERM or Ctrl-C. Exit 2 when no
        real GPU backend works (it never reports the simulated node unless --backend sim says so).
        """
        from ops.errors import GpuwardenError
        from ops.k8s.config import for_settings, parse_duration
        from ops.k8s.loop import KubernetesLoop
        from ops.k8s.node import KubernetesNode
        from ops.k8s.nodesignal import POLICIES
        settings: Settings = ctx.obj
        if policy is not None and policy not in POLICIES:
            raise GpuwardenError(f"unknown policy {policy!r}", f"choose one of: {', '.join(POLICIES)}")
        secs = parse_duration(taint_after) if taint_after is not None else None
        if taint_after is not None and secs is None:
            raise GpuwardenError(f"cannot read --taint-after {taint_after!r}", "e.g. --taint-after 2m or 90s")
        cfg = for_settings(settings, node_name=node_name, policy=policy, taint_after=secs, health=health,
                           health_socket=health_socket)
        # On the automatic sim fallback it would tell Kubernetes about a fake node as if it were this one.
        from ops.backends.select import open_backend
        open_backend(settings, fallback_to_sim=False).close()

        def log(message: str) -> None:
            sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {message}\n")
            sys.stderr.flush()

        loop = KubernetesLoop(settings, KubernetesNode(settings, cfg, log=log), interval=interval, log=log)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: loop.stop())
        loop.run()
        log("stopped")
