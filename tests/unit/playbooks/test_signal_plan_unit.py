"""The unit half of tests/integration/playbooks/test_signal_plan.py (its tests that need no process, socket or server); the pair's subject:
Nothing signalled unseen (issue 35): every plan names the processes it may signal, the reaper sends nothing
else, guarded roles need --end-parents, unattended policies never end a parent or an engine.

Real processes (a zombie under a live parent that never reaps), the simulated node, and the CLI (text, --json).
"""

from __future__ import annotations



from engines.harness import records, start_sim_tenant_engine, supervised  # noqa: F401

from gpuwarden.playbooks.signalplan import (PLAIN, UNIT_MAIN, Classifier, command_parts)


def test_a_units_main_process_is_told_from_its_cgroup_and_main_pid(tmp_path):
    proc = tmp_path / "proc"
    for pid, ppid in ((4425, 1), (4430, 4425)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (vllm) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777"
                                              " 0 0\n")
        (proc / str(pid) / "cgroup").write_text("0::/system.slice/vllm-serve.service\n")
        (proc / str(pid) / "cmdline").write_bytes(b"/opt/venv/bin/vllm\0serve\0--api-key\0s3cr3t-value\0")
    asked = []
    who = Classifier(proc, main_pid=lambda unit, user: asked.append(unit) or 4425)
    assert who.role(4425) == (UNIT_MAIN, "vllm-serve.service") and who.role(4430) == (PLAIN, None)
    assert asked == ["vllm-serve.service"]  # one question per unit
    # No manager to ask: the unit's process whose parent is PID 1 is taken for its main process.
    guess = Classifier(proc, main_pid=lambda unit, user: None)
    assert guess.role(4425)[0] == UNIT_MAIN and guess.role(4430)[0] == PLAIN
    program, command = command_parts(4425, proc)
    assert program == "vllm" and command.startswith("vllm serve --api-key [REDACTED") and "s3cr3t" not in command
    e = who.entry(4425, 777, ["SIGCHLD", "SIGTERM", "SIGKILL"], "parent of zombie pid 4426")
    assert e.signals == ["SIGCHLD"] and "main process of a systemd unit vllm-serve.service" in e.line()


def test_the_agent_reports_a_policys_plan_before_it_runs():
    from gpuwarden.playbooks.agentpolicies import Policies
    from gpuwarden.playbooks.framework import Event

    class Agent:
        events: list = []

        def emit(self, event):
            self.events.append(event)

    agent = Agent()
    policies = Policies.__new__(Policies)  # only the forwarding is under test: no worker thread
    policies.agent = agent
    entry = {"pid": 4425, "user": "svc", "uid": 1000, "role": PLAIN, "program": "python3",
             "command": "python3 -m server --port 8000", "signals": ["SIGCHLD"], "why": "parent of zombie pid 4426",
             "withheld": "not ended: an unattended policy only asks it to reap", "sent": []}
    policies._forward(Event("planned", "purge", None, "purge GPU 1", {"steps": [], "signals": [entry]}))
    [event] = agent.events
    assert "purge may signal: pid 4425 (svc, plain process): python3 -m server --port 8000 — SIGCHLD" in event.text
    assert "only asks it to reap" in event.text and event.data["signals"] == [entry]
