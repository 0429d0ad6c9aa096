"""The agent's kernel-log watch fed real kernel lines through a FIFO, its policies running the real playbooks,
and the sd_notify datagram it sends.
"""

from __future__ import annotations

import os
import socket


from helpers.agentnode import start_agent
from helpers.simnode import kill_and_wait_zombie, start_careless_parent, wait_for

from gpuwarden.ops.foundation import journal
from gpuwarden.ops.agent.kernelwatch import TriageAdapter, useful
from gpuwarden.ops.agent.notify import notify
from helpers.agent_policies import kmsg_records

GiB = 1 << 30


# The sim node these tests run on (conftest.py's sim_state fixture reads it).
SIM_NODE = {"gpus": 2, "vram": "8GiB"}


def test_the_adapter_reads_kmsg_records_and_plain_lines_and_repeats_a_finding_once_a_minute(fixtures):
    assert not useful(" DEVICE=+pci:0000:c1:00.0") and not useful("  ") and useful("  continued text")
    fault = (fixtures / "dmesg/rocm5745_gfx1151_gfxhub_pagefault_mes_sq_intr_gpu_reset_mode2.log").read_text()
    adapter = TriageAdapter()
    first = adapter.feed(kmsg_records(fault), now=1000.0)
    assert any(f["category"] == "gpu-page-fault" for f in first)
    again = adapter.feed(kmsg_records(fault, 500), now=1010.0)  # the same faults ten seconds later
    assert not any(f["category"] == "gpu-page-fault" for f in again)
    later = adapter.feed(kmsg_records(fault, 900), now=1100.0)
    pages = [f for f in later if f["category"] == "gpu-page-fault"]
    assert pages and all(f["new_since_last_event"] > 0 for f in pages)  # a minute on: again, with what grew


def test_kernel_findings_from_a_fifo_become_events(sim_state, tmp_path, fixtures):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    conf = tmp_path / "node.toml"
    conf.write_text(f'[agent]\nkmsg = "{fifo}"\n')
    agent = start_agent(sim_state, "--config", str(conf))
    try:
        wait_for(lambda: agent.json("/healthz")["kernel_watch"] == str(fifo), what="the watch on the FIFO")
        fault = (fixtures / "dmesg/rocm5745_gfx1151_gfxhub_pagefault_mes_sq_intr_gpu_reset_mode2.log").read_text()
        segv = (fixtures / "dmesg/rocm4189_rx570_segfault_libamdhip64.log").read_text()
        with open(fifo, "w") as w:
            w.write("\n".join(kmsg_records(fault)) + "\n")
            w.write(segv)  # plain dmesg lines work too
        def kernel_events():
            return [e for e in agent.json("/v1/events")["events"] if e["kind"] == "kernel"]

        def both():  # the page fault's lines and the segfault's come in as separate findings
            found = kernel_events()
            cats = {e["data"]["category"] for e in found}
            return found if "gpu-page-fault" in cats and "segfault" in cats else None
        kernel = wait_for(both, what="a page-fault and a segfault kernel event")
        page = next(e for e in kernel if e["data"]["category"] == "gpu-page-fault")
        assert page["level"] == "error" and page["text"].startswith("kernel: ") and "0000:c1:00.0" in page["data"]["devices"]
        # The same finding again within a minute is one event, not a flood.
        n = len(kernel_events())
        xid = (fixtures / "dmesg/nvidia_xid31_mmu_fault_rtx5070ti_open595.log").read_text()
        with open(fifo, "w") as w:
            w.write("\n".join(kmsg_records(fault, 500)) + "\n")
            w.write(xid)  # a new finding after the repeat: once it is in, the repeat has been read
        after = wait_for(lambda: [e for e in kernel_events() if e["data"]["category"] == "xid"] and kernel_events(),
                         what="the Xid after the repeated page fault")
        assert len([e for e in after if e["data"]["category"] != "xid"]) <= n + 1
    finally:
        agent.stop()


def test_policies_drain_bundle_and_purge_through_the_playbooks(sim_state, tmp_path):
    conf = tmp_path / "node.toml"
    conf.write_text('[agent]\nkmsg = "off"\ndrain_on_residual_after = "1s"\nbundle_on = ["residual"]\n'
                    'purge_dead_holders = true\n')
    agent = start_agent(sim_state, "--config", str(conf))
    parent, child = start_careless_parent(sim_state, 0, "1GiB")
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
        kill_and_wait_zombie(child)
        # Drain: the residual on GPU 0 lasts past 1 s, so the drain playbook marks it drained.
        wait_for(lambda: 0 in agent.json("/v1/snapshot")["drained"], timeout=30, what="GPU 0 drained by the policy")
        # Purge: zombies only, and its parent only asked to reap: the careless parent lives on.
        wait_for(lambda: any(e["action"] == "reaper-signal" and e.get("signal") == "SIGCHLD"
                             for e in journal.read(sim_state)), timeout=30, what="SIGCHLD to the parent")
        assert parent.poll() is None
        assert not any(e["action"] == "reaper-signal" and e.get("signal") in ("SIGTERM", "SIGKILL")
                       for e in journal.read(sim_state))
        # Bundle: one incident bundle for the residual.
        wait_for(lambda: list((sim_state / "bundles").glob("*.tar.gz")), timeout=60, what="the policy's bundle")
        texts = [e["text"] for e in agent.json("/v1/events?limit=10000")["events"] if e["kind"] == "policy"]
        assert any("drain" in t for t in texts) and any("bundle" in t for t in texts) and\
            any("purge" in t for t in texts), texts
        actions = {e["action"] for e in journal.read(sim_state)}
        assert {"drain", "purge", "bundle"} <= actions, actions  # the same journal as a person's runs
    finally:
        parent.kill()
        parent.wait()
        agent.stop()


def test_notify_sends_one_datagram_to_a_path_or_an_abstract_socket(tmp_path):
    path = tmp_path / "n.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(5)
    assert notify("READY=1\nSTATUS=x", {"NOTIFY_SOCKET": str(path)})
    assert s.recv(100) == b"READY=1\nSTATUS=x"
    s.close()
    name = f"gpuwarden-test-{os.getpid()}"
    a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.bind("\0" + name)
    a.settimeout(5)
    assert notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
    assert a.recv(100) == b"STOPPING=1"
    a.close()
    assert notify("READY=1", {}) is False
