"""The agent asks a dear per-process GPU% source (NVML's per-process utilisation: 1.5 ms of CPU a call on an H100)
at its usual cadence only while someone reads it: a /v1/snapshot, a per-process /metrics, or a listener that
exports per-process series. With no reader for PROCESS_GPU_READERS_S it asks seldom (issue 38)."""

from __future__ import annotations

import os

from standins import pynvml_standin as standin
from standins.nvsmi_capture import parse_q

from gpuwarden.ops.agent.events import EventLog
from gpuwarden.ops.agent.history import History
from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.metrics.reading import MetricsOptions
from gpuwarden.ops.node.backends.nvml import NvmlBackend
from gpuwarden.ops.sampling.sampler import Sampler
from gpuwarden.ops.services import agent_daemon
from gpuwarden.ops.services.agent_daemon import Agent
from gpuwarden.ops.services.metrics_exporter import MetricsExporter

H100_LOAD_Q = "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt"


def make_agent(settings, tmp_path, fixtures) -> tuple[Agent, NvmlBackend]:
    settings = settings.with_(dev_root=tmp_path / "dev")
    gpus = parse_q(fixtures / H100_LOAD_Q)
    mod = standin.build(gpus, utilisation={0: [(gpus[0].processes[0].pid, 10, 50, 5, 0, 0)]})
    backend = NvmlBackend(settings, module=mod)
    agent = Agent(settings, AgentConfig(interval=1.0, kmsg="off"), sampler=Sampler(settings, backend),
                  log_stream=open(os.devnull, "w"))
    agent.history = History(agent.dir, 1.0)
    agent.events = EventLog(agent.dir, 1000)
    return agent, backend


def test_a_snapshot_reader_keeps_it_at_its_cadence_and_its_absence_quiets_it(settings, tmp_path, fixtures):
    agent, backend = make_agent(settings, tmp_path, fixtures)
    try:
        agent._deliver(agent._sample())
        assert backend.util_quiet is True  # nobody has read anything yet
        assert agent.snapshot_document() is not None  # what /v1/snapshot serves
        agent._deliver(agent._sample())
        assert backend.util_quiet is False
        agent._process_gpu_read_at -= agent_daemon.PROCESS_GPU_READERS_S  # that reader went away long ago
        agent._deliver(agent._sample())
        assert backend.util_quiet is True
    finally:
        backend.close()


def test_per_process_metrics_are_a_reader(settings, tmp_path, fixtures):
    agent, backend = make_agent(settings, tmp_path, fixtures)
    try:
        agent._deliver(agent._sample())
        exporter = MetricsExporter(agent)  # no listener: only a one-off per-process exposition reads it
        agent.metrics = exporter
        assert exporter.text() and (agent._sample() is not None and backend.util_quiet is True)
        assert exporter.text(per_process=True)  # /metrics?per_process=1 on the API socket
        agent._sample()
        assert backend.util_quiet is False
        # A listener that exports per-process series is a reader for as long as it listens (not bound here).
        agent._process_gpu_read_at -= agent_daemon.PROCESS_GPU_READERS_S
        agent.metrics = MetricsExporter(agent, MetricsOptions(per_process=True), listen="127.0.0.1:0")
        agent._sample()
        assert backend.util_quiet is False
        agent.metrics = MetricsExporter(agent, MetricsOptions(per_process=False), listen="127.0.0.1:0")
        agent._sample()
        assert backend.util_quiet is True
    finally:
        backend.close()
