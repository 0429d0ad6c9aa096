"""End to end with a real Prometheus: it scrapes a real agent on the sim node every second and evaluates the
shipped rules (their `for:` shortened in the test copy). A tenant killed under leak-on-kill makes the residual
series equal the leaked bytes and the residual alert fire; purge --escalate-reset clears both. A kernel page
fault on the agent's kernel-log FIFO fires the fault alert. Every PromQL expression of the dashboard runs.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from helpers.agentnode import start_agent
from helpers.simnode import start_tenant, wait_for
from helpers.agent_policies import kmsg_records
from helpers.metrics_rules import DASHBOARD
from helpers.metrics_e2e import Prom

GiB = 1 << 30
pytestmark = pytest.mark.slow


@pytest.fixture
def node(cli, state_dir, tmp_path, fixtures):
    assert cli("--backend", "sim", "sim", "init", "--gpus", "4", "--vram", "24GiB").returncode == 0
    assert cli("--backend", "sim", "sim", "fault", "leak-on-kill", "on").returncode == 0
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    conf = tmp_path / "node.toml"
    conf.write_text(f'[agent]\nkmsg = "{fifo}"\n')
    agent = start_agent(state_dir, "--config", str(conf), interval="0.5",
                        env={"GPUWARDEN_METRICS_LISTEN": "127.0.0.1:0"})
    try:
        listen = wait_for(lambda: re.search(r"metrics on http://(127\.0\.0\.1:\d+)/metrics", agent.log_text()),
                          what="the agent's metrics listener")[1]
        prom = Prom(tmp_path, listen)
        try:
            yield agent, prom, fifo, conf
        finally:
            prom.stop()
    finally:
        agent.stop()


def test_residual_and_fault_alerts_against_a_real_prometheus(node, cli, state_dir, fixtures):
    agent, prom, fifo, conf = node
    wait_for(lambda: prom.value('up{job="gpuwarden"}') == 1, timeout=30, what="the agent scraped", poll=0.2)
    assert prom.value('gpuwarden_gpu_residual_bytes{gpu="2"}') == 0

    tenant = start_tenant(state_dir, 2, "3GiB")
    tenant.kill()
    tenant.wait(10)  # reaped: under leak-on-kill its VRAM stays, held by nobody
    wait_for(lambda: prom.value('gpuwarden_gpu_residual_bytes{gpu="2"}') == 3 * GiB, timeout=30,
             what="the residual series at the leaked bytes", poll=0.2)
    wait_for(lambda: prom.value('gpuwarden:gpu_residual_bytes:significant{gpu="2"}') == 3 * GiB, timeout=30,
             what="the recording rule", poll=0.2)
    firing = wait_for(lambda: prom.firing("GpuwardenResidualVram"), timeout=30, what="the residual alert", poll=0.2)
    assert [a["labels"]["gpu"] for a in firing] == ["2"]
    assert "none (an ownerless leak" in firing[0]["annotations"]["description"]
    assert "3GiB" in firing[0]["annotations"]["summary"]
    wait_for(lambda: prom.firing("GpuwardenGpuNeedsReset"), timeout=30, what="the needs-reset alert", poll=0.2)
    assert prom.firing("GpuwardenSimulatedNode")  # this exporter serves the sim node: it says so

    # `gpuwarden metrics` asks the running agent (its mode says so) instead of sampling.
    proc = cli("--backend", "sim", "metrics")
    assert proc.returncode == 0 and 'mode="agent"' in proc.stdout and "gpuwarden_kernel_findings_total" in proc.stdout

    # A GPU page fault in the kernel log: the finding counter rises and the fault alert fires.
    fault = (fixtures / "dmesg/rocm5745_gfx1151_gfxhub_pagefault_mes_sq_intr_gpu_reset_mode2.log").read_text()
    with open(fifo, "w") as w:
        w.write("\n".join(kmsg_records(fault)) + "\n")
    wait_for(lambda: prom.value('sum(gpuwarden_kernel_findings_total{category="gpu-page-fault"})') or 0,
             timeout=30, what="the page-fault counter", poll=0.2)
    alert = wait_for(lambda: [a for a in prom.firing("GpuwardenKernelGpuFault")
                              if a["labels"]["category"] == "gpu-page-fault"],
                     timeout=30, what="the kernel fault alert", poll=0.2)
    assert alert[0]["labels"]["severity"] == "warning"

    # Every expression of the dashboard runs against this Prometheus (Grafana's variables filled in).
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$instance", ".*")
            assert "$" not in expr, expr
            prom.api("query", query=expr)  # raises on a PromQL error

    proc = cli("--backend", "sim", "purge", "2", "--yes", "--escalate-reset")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_for(lambda: prom.value('gpuwarden_gpu_residual_bytes{gpu="2"}') == 0, timeout=30,
             what="the residual series back at 0", poll=0.2)
    wait_for(lambda: not prom.firing("GpuwardenResidualVram") and not prom.firing("GpuwardenGpuNeedsReset"),
             timeout=30, what="the residual alerts resolved", poll=0.2)
    assert prom.value('gpuwarden_gpu_needs_reset{gpu="2"}') == 0
