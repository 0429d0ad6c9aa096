"""The agent under trouble: kill -9 mid-write, a hung backend call, clients that never read or never ask,
other users at the socket, and fuzzed query parameters.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from helpers.agentnode import snapshot_of, start_agent
from helpers.paths import REPO
from helpers.simnode import wait_for

from gpuwarden.ops.foundation import jsondoc
from gpuwarden.ops.agent.client import get

GiB = 1 << 30


# The sim node these tests run on (conftest.py's sim_state fixture reads it).
SIM_NODE = {"gpus": 2, "vram": "8GiB"}


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line must parse


def test_kill_9_leaves_files_a_restarted_agent_reads_and_repairs(sim_state):
    from gpuwarden.ops.node.sim.node import SimNode
    agent = start_agent(sim_state)
    wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
    SimNode(sim_state).leak(1, 1 * GiB)
    wait_for(lambda: any(e["kind"] == "residual-appeared" for e in agent.json("/v1/events")["events"]),
             what="the residual event")
    last = agent.json("/v1/events")["last_seq"]
    agent.stop(signal.SIGKILL)
    events = sim_state / "agent" / "events.jsonl"
    trend = sim_state / "agent" / "trend.jsonl"
    # What a kill in the middle of a write leaves: half a line at the end of each file.
    with open(events, "ab") as f:
        f.write(b'{"seq": 99999, "ts": 17')
    with open(trend, "ab") as f:
        f.write(b'{"t": 1')
    again = start_agent(sim_state)
    try:
        wait_for(lambda: again.json("/healthz")["ok"], what="the restarted agent")
        seqs = [e["seq"] for e in again.json("/v1/events?limit=10000")["events"]]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert seqs[0] == 1 and last in seqs and 99999 not in seqs  # old events kept, torn one dropped
        assert max(seqs) > last  # numbering goes on after the restart
    finally:
        again.stop()
    assert [e["seq"] for e in lines_of(events)][-1] == max(seqs) + 1  # "agent stopped", after the repair
    lines_of(trend)


def test_a_hung_backend_call_marks_the_snapshot_stale_and_the_api_keeps_answering(sim_state, cli):
    # A read deadline longer than the test: the driver read blocks the sampler itself, which the agent's own
    # staleness must then show (with the default deadline the GPU is named STALE instead: test_deadlines.py).
    agent = start_agent(sim_state, "--read-timeout", "600")
    hung = False
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
        assert cli("sim", "fault", "hang", "on").returncode == 0  # the driver call that never returns
        hung = True
        health = wait_for(lambda: (h := agent.json("/healthz"))["stale"] and h, timeout=20, what="stale")
        assert health["busy_for_s"] > 0 and agent.get("/healthz").status == 503
        snap = snapshot_of(agent)
        assert snap["agent"]["stale"] is True and snap["agent"]["age_s"] > 2
        proc = cli("--backend", "sim", "status", "--json")
        assert proc.returncode == 1 and json.loads(proc.stdout)["agent"]["stale"] is True
        assert "STALE" in cli("--backend", "sim", "status").stdout
        wait_for(lambda: any("no snapshot for" in e["text"] and "backend call" in e["text"]
                             for e in agent.json("/v1/events")["events"]), what="the stale event")
        assert cli("sim", "fault", "hang", "off").returncode == 0  # the driver answers at last
        hung = False
        # 60 s: a loaded box (two xdist workers on two cores) once needed more than 20 s here
        wait_for(lambda: agent.json("/healthz")["ok"], timeout=60, what="sampling to resume")
        assert "sampling works again" in [e["text"] for e in agent.json("/v1/events")["events"]]
    finally:
        if hung:
            cli("sim", "fault", "hang", "off")  # nothing stays blocked behind a failed assertion
        agent.stop()


def test_silent_and_never_reading_clients_cannot_block_the_agent(sim_state):
    from gpuwarden.ops.node.sim.node import SimNode
    agent = start_agent(sim_state)
    wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    stuck.connect(str(agent.sock))
    stuck.sendall(b"GET /v1/events?follow=1&since=1h HTTP/1.1\r\nHost: a\r\n\r\n")  # then never reads
    silent = []
    for _ in range(80):  # more than the connection cap, none of them sending a byte
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(agent.sock))
        silent.append(s)
    try:
        t0 = time.monotonic()
        # The cap answers at once (503) or a slot frees within the idle timeout: never a hang.
        reply = wait_for(lambda: get(agent.sock, "/healthz", timeout=3.0), timeout=15, what="an answer")
        assert reply.status in (200, 503) and time.monotonic() - t0 < 10
        for s in silent:
            s.close()
        node = SimNode(sim_state)
        for i in range(30):  # events the stuck stream cannot take
            node.leak(i % 2, 64 << 20)
            node.reset(i % 2)
        health = wait_for(lambda: (r := get(agent.sock, "/healthz")) and r.status == 200 and r.json(),
                          timeout=15, what="healthz")
        assert health["age_s"] < 3, health  # sampling never stopped
        assert snapshot_of(agent)["agent"]["stale"] is False
    finally:
        stuck.close()
        agent.stop()


def _as_nobody(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                           "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_the_socket_refuses_other_users_unless_the_config_grants_their_group(cli):
    base = Path(tempfile.mkdtemp(prefix="gw-sock-"))
    try:
        os.chmod(base, 0o711)
        state = base / "s"
        assert cli("--state-dir", str(state), "sim", "init", "--gpus", "1").returncode == 0
        os.chmod(state, 0o711)  # even with a traversable state dir, the socket's own mode refuses
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from gpuwarden.ops.agent.client import get; "
                f"r = get({str(state / 'agent.sock')!r}, '/healthz'); print(r.status if r else 'refused')")
        agent = start_agent(state)
        try:
            wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
            assert stat.S_IMODE(os.stat(agent.sock).st_mode) == 0o660
            assert _as_nobody(code).stdout.strip() == "refused"
            os.chmod(agent.sock, 0o666)  # a socket opened to all by mistake: peer credentials still refuse
            assert _as_nobody(code).stdout.strip() == "refused"
        finally:
            agent.stop()
        conf = base / "node.toml"
        conf.write_text('[agent]\nsocket_group = "nogroup"\n')
        os.chmod(state, 0o700)
        agent = start_agent(state, "--config", str(conf))
        try:
            wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
            assert os.stat(agent.sock).st_gid == 65534 and stat.S_IMODE(os.stat(state).st_mode) == 0o710
            proc = _as_nobody(code)
            assert proc.stdout.strip() == "200", proc.stderr
        finally:
            agent.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_fuzzed_query_parameters_get_clear_400s(sim_state):
    agent = start_agent(sim_state)
    rng = random.Random(20261201)
    names = ["gpu", "since", "limit", "after", "resolution", "events", "follow", "x", "", "gpu[]", "%00"]
    values = ["", "0", "-1", "1e309", "nan", "2h", "99999999999999999999", "ünï", "1;DROP", "\x00", "%zz", "a" * 5000,
              "2026-12-01T00:00:00Z", "0x10", " 3", "minute", "fine", "1.5"]
    try:
        wait_for(lambda: agent.json("/healthz")["ok"], what="first snapshot")
        seen = {200: 0, 400: 0}
        for _i in range(300):
            path = rng.choice(["/v1/history", "/v1/events", "/v1/snapshot", "/healthz"])
            params = []
            for _ in range(rng.randint(0, 4)):
                name = rng.choice(names)
                value = rng.choice(values)
                if name == "follow" and value in ("1", "true"):
                    value = "2"
                params.append(f"{quote(name, safe='%')}={quote(value, safe='%')}" if rng.random() < 0.8
                              else rng.choice(["&&", "=", "a=b=c", "%", "?"]))
            target = path + ("?" + "&".join(params) if params else "")
            reply = get(agent.sock, target, timeout=10)
            assert reply is not None, target
            assert reply.status in (200, 400), (target, reply.status, reply.body[:200])
            doc = reply.json()
            jsondoc.validate(doc)
            if reply.status == 400:
                assert doc["schema"] == "gpuwarden.api-error/1" and doc["error"] and "\n" not in doc["error"]
            seen[reply.status] += 1
        assert seen[200] and seen[400]
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not HTTP at all
        raw.settimeout(5)
        raw.connect(str(agent.sock))
        raw.sendall(b"\x16\x03\x01 garbage\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.")
        raw.close()
        assert agent.json("/healthz")["ok"]
    finally:
        agent.stop()
    log = agent.log_text()
    assert "Traceback" not in log and "internal error" not in log and "error: API" not in log, log
