"""An idle agent's threads sleep until there is work: the API thread until a connection comes, the kernel-log watch
until a line comes, the main thread until its latest snapshot could turn stale or a signal comes. Each used to wake
on a timer to look for a stop (twice a second, twice a second, once a second): on an idle H100 node those wake-ups
were a fifth of the agent's CPU. Absence of activity can only be seen over a window: each window below holds two
or more of the old timer's wake-ups; each test then checks that the sleeper still wakes for real work and stops."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from helpers.agentnode import start_agent
from helpers.simnode import wait_for
from helpers.sleepers import sleeps

from gpuwarden.ops.agent.client import get
from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.services.agent_daemon import Agent


def test_the_api_and_kernel_log_threads_sleep_until_there_is_work(state_dir):
    SimNode(state_dir).init(gpus=1, vram=8 << 30)
    fifo = state_dir / "kmsg.fifo"
    os.mkfifo(fifo)
    agent = Agent(Settings(state_dir=state_dir, backend="sim"), AgentConfig(interval=1.0, kmsg=str(fifo)),
                  log_stream=open(os.devnull, "w"))
    agent.start()
    try:
        wait_for(lambda: agent.latest() is not None, 30, "the first snapshot")
        assert agent._server_thread is not None and agent._kernel is not None and agent._kernel._thread is not None
        api, kmsg = agent._server_thread.native_id, agent._kernel._thread.native_id
        assert api is not None and kmsg is not None
        me = os.getpid()
        wait_for(lambda: get(agent.socket, "/healthz") is not None, 30, "the API answering")
        before = sleeps(me, api), sleeps(me, kmsg)
        threading.Event().wait(1.2)  # two or three wake-ups of each old loop
        after = sleeps(me, api), sleeps(me, kmsg)
        assert after[0] - before[0] <= 1, f"the API thread woke {after[0] - before[0]} times with no connection"
        assert after[1] - before[1] <= 1, f"the kernel log watch woke {after[1] - before[1]} times with no line"
        # Both still wake for work at once.
        reply = get(agent.socket, "/v1/snapshot")
        assert reply is not None and reply.status == 200
        with open(fifo, "w") as w:
            w.write("amdgpu 0000:83:00.0: amdgpu: GPU reset begin!\n")
        wait_for(lambda: agent._kernel is not None and agent._kernel.lines_read >= 1, 30, "the line triaged")
    finally:
        began = time.monotonic()
        kernel = agent._kernel
        agent.stop()
        assert time.monotonic() - began < 5, "stopping waited on a timer"
    assert not agent._server_thread.is_alive()
    assert kernel is not None and kernel._thread is not None and not kernel._thread.is_alive()
    assert kernel._wake.closed  # the wake pipe is closed with the watch


def test_the_main_thread_sleeps_until_a_snapshot_could_be_stale_and_wakes_for_signals(state_dir: Path):
    SimNode(state_dir).init(gpus=1, vram=8 << 30)
    config = state_dir / "node.toml"
    config.write_text('[agent]\nkmsg = "off"\n')  # the kernel log has its own test above
    agent = start_agent(state_dir, "--config", str(config), interval="1")
    try:
        pid = agent.proc.pid
        wait_for(lambda: get(agent.sock, "/healthz") is not None, 30, "the API answering")
        before = sleeps(pid, pid)
        # The stale limit at a 1 s interval is 5 s: the main thread wakes at most once in 4 s (it woke every
        # second before). One wake-up can count twice: the thread may sleep again on the GIL once woken.
        threading.Event().wait(4.0)
        woke = sleeps(pid, pid) - before
        assert woke <= 2, f"the idle main thread slept {woke} times in 4 s"
        # SIGHUP still reloads at once, not at the next stale check.
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded its config" in agent.log_text(), 4, "the reload, well before a 5 s wait ended")
        began = time.monotonic()
        assert agent.stop(signal.SIGTERM, timeout=10) == 0
        assert time.monotonic() - began < 4
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
