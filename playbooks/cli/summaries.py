"""The one-line summary of every command in its group's `--help` list: a whole short sentence that fits.

Click cuts a docstring's first sentence at the list's width ("Show GPUs, their processes, residual VRAM with its
holders,..."); a command named here is listed with this line instead (Click's short_help), its docstring unchanged.
"""

from __future__ import annotations

from typing import Any

# "group command" for a group's commands. At most 60 characters: the root's list has 64 at 80 columns.
SUMMARIES: dict[str, str] = {
    "status": "Show the GPUs, their processes, residual VRAM and engines.",
    "doctor": "Check that this node is fit to serve.",
    "fix": "Fix GPU N: free its residual VRAM, resetting it if need be.",
    "launch": "Start the node config's engines under detached shims.",
    "engines": "Supervised engines: list, logs, stop, restart.",
    "arena": "The shared weight arena: create, verify, inspect, budget.",
    "canary": "Run the canary engine against the arena on one GPU.",
    "drain": "Drain GPU N: stop its engines and keep new ones off it.",
    "undrain": "Undrain GPU N: let launch use it again.",
    "reset": "Reset GPU N: every context on it is lost.",
    "purge": "Remove what keeps residual VRAM held, then check it is gone.",
    "baseline": "The idle VRAM baseline per GPU: record it, show it.",
    "bundle": "Collect an incident bundle: logs, tools' output, snapshot.",
    "triage": "Find what went wrong on a GPU node, most important first.",
    "report": "Write the bug report an upstream tracker asks for.",
    "known": "Known GPU-node issues from public trackers.",
    "config": "The node config: check it, print examples.",
    "journal": "Show the journal of every change gpuwarden made.",
    "agent": "Run the node agent: sampler, history, HTTP API, /metrics.",
    "k8s-agent": "Run the node agent in Kubernetes mode, in the foreground.",
    "history": "Show VRAM, residual VRAM and holders per GPU over time.",
    "metrics": "Print the node's metrics once, in Prometheus' format.",
    "sim": "The simulated node, for demos, tests and drills.",
    "gpu-check": "Are these GPUs fit for a new tenant? (init containers)",
    "post-clean": "preStop hook: wait for the pod's processes, then purge.",
    "fleet": "Many nodes over SSH: status, console, remote playbooks.",
    "tui": "Open the live console.",
    "serve": "Serve the console in a browser.",
    "engines list": "Every engine in the state dir, with its phase.",
    "engines logs": "Print an engine's stdout and stderr.",
    "engines stop": "Stop an engine through its shim.",
    "engines restart": "Stop an engine and start it again.",
    "arena create": "Create an arena: payload first, then the header.",
    "arena verify": "Check the header and every chunk's hash.",
    "arena inspect": "Show the header and who maps the arena.",
    "arena budget": "Will the registrations fit KFD's system-memory limit?",
    "arena probe": "Reproduce N concurrent arena registrations.",
    "config check": "Parse and validate the node config.",
    "config example": "Print a complete, commented node config.",
    "fleet status": "Every node's status in one table, worst first.",
    "fleet purge": "Run each node's own `gpuwarden purge`.",
    "fleet drain": "Run each node's own `gpuwarden drain GPU`.",
    "fleet undrain": "Run each node's own `gpuwarden undrain GPU`.",
    "fleet baseline": "Run each node's own `gpuwarden baseline record`.",
    "fleet bundle": "Each node collects its own incident bundle.",
    "fleet tui": "Open the fleet console: a row per node, worst first.",
    "sim hold": "Run a simulated tenant that holds VRAM on a GPU.",
    "sim leak": "Leave ownerless residual VRAM on a simulated GPU.",
    "sim show": "Show the simulated node: GPUs, faults, leaks, resets.",
    "sim scenario": "Set the simulated node up as one of the incidents.",
}


def summarise(name: str, command: Any) -> None:
    """Give `command` (listed as `name` in the root's list) and its own commands their summaries."""
    if name in SUMMARIES and not getattr(command, "short_help", None):
        command.short_help = SUMMARIES[name]
    for sub_name, sub in (getattr(command, "commands", None) or {}).items():
        key = f"{name} {sub_name}"
        if key in SUMMARIES and not sub.short_help:
            sub.short_help = SUMMARIES[key]
