"""The node agent: one long-running sampler per node with history, an event log, a kernel-log watch and a
local HTTP API over a unix socket; status, the TUI, the exporter and the k8s glue read it.

ops never imports playbooks: the `gpuwarden agent` command and the policies that run playbooks live in
playbooks/, and plug into Agent through its observer hooks.
"""
