"""`gpuwarden fleet` against real OpenSSH servers: status, host keys, inventories, jump hosts, playbooks, bundles."""

from __future__ import annotations

import json
import os
import socket

import pytest

from helpers.cli import gpuwarden
from helpers.sshfleet import black_hole, client_env, node_cli

from helpers.journal import read_journal
from gpuwarden.ops.foundation import jsondoc
from helpers.fleet_ssh import fleet, rows

ALL = "gpu[01-09]"


def test_status_shows_every_node_worst_first_with_reasons(ssh_fleet):
    proc = fleet(ssh_fleet, "status", "--nodelist", ALL, "--json", "--timeout", "20")
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the worst node's: some could not be seen
    doc = json.loads(proc.stdout)
    nodes = rows(proc)
    assert len(nodes) == 9
    assert [n["state"] for n in doc["nodes"]][:2] == ["unreachable", "unreachable"]
    assert "connection refused" in nodes["gpu09"]["reason"]
    assert "HOST KEY CHANGED" in nodes["gpu04"]["reason"] and "ssh-keygen -R" in nodes["gpu04"]["hint"]
    assert nodes["gpu02"]["state"] == "attention" and nodes["gpu02"]["residual_gpus"] == [1]
    assert nodes["gpu02"]["residual_bytes"] == 3 * 2**30
    assert nodes["gpu03"]["state"] == "attention" and nodes["gpu03"]["engines"]["crashed"] == 1
    for name in ("gpu01", "gpu05", "gpu06", "gpu07", "gpu08"):
        assert nodes[name]["state"] == "ok" and nodes[name]["gpus"] == 2 and nodes[name]["simulated"] is True
    assert doc["counts"] == {"nodes": 9, "ok": 5, "attention": 2, "unreachable": 2, "error": 0}

    text = fleet(ssh_fleet, "status", "--nodelist", ALL, "--timeout", "20")
    assert text.returncode == 2
    lines = text.stdout.splitlines()
    assert lines[0].split()[:4] == ["NODE", "STATE", "GPUS", "RESIDUAL"]
    assert "3.0 GiB on 1" in text.stdout and "0/1 serving 1 CRASHED" in text.stdout
    assert "SIMULATED" in text.stdout
    assert any(line.startswith("gpu09: connection refused") for line in lines)
    assert "Traceback" not in text.stdout + text.stderr


def test_only_healthy_nodes_exit_0(ssh_fleet):
    proc = fleet(ssh_fleet, "status", "--nodelist", "gpu01,gpu05", "--parallel", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_unknown_host_key_is_refused_with_the_line_to_add_and_accept_new_adds_it(ssh_fleet, tmp_path):
    env = client_env(ssh_fleet)
    node = ssh_fleet.node("gpu05")
    known = ssh_fleet.known_hosts
    saved = known.read_text()
    try:
        known.write_text("".join(line + "\n" for line in saved.splitlines() if f":{node.port} " not in line))
        proc = gpuwarden("fleet", "status", "--nodelist", "gpu05", "--json", env=env, timeout=60)
        nodes = rows(proc)
        assert nodes["gpu05"]["state"] == "unreachable" and "not in" in nodes["gpu05"]["reason"]
        assert node.known_line in nodes["gpu05"]["hint"]  # the exact line, ready to paste
        assert node.known_line not in known.read_text()  # never accepted silently

        proc = gpuwarden("fleet", "status", "--nodelist", "gpu05,gpu04", "--accept-new", "--json", env=env,
                         timeout=60)
        nodes = rows(proc)
        assert nodes["gpu05"]["state"] == "ok"
        assert node.known_line in known.read_text().splitlines()
        assert "HOST KEY CHANGED" in nodes["gpu04"]["reason"]  # a changed key stays refused with --accept-new
    finally:
        known.write_text(saved)


def test_inventories_hosts_file_ansible_group_and_fleet_config(ssh_fleet, tmp_path):
    env = client_env(ssh_fleet)
    hosts = tmp_path / "hosts"
    hosts.write_text("# the lab\ngpu01   # first\n\n" + f"{ssh_fleet.user}@gpu05\n")
    proc = gpuwarden("fleet", "status", "--hosts", str(hosts), "--json", env=env, timeout=60)
    assert sorted(rows(proc)) == ["gpu01", "gpu05"] and proc.returncode == 0

    # Ansible: the address, port and user come from the inventory's variables, not from an ssh alias.
    n6, n7 = ssh_fleet.node("gpu06"), ssh_fleet.node("gpu07")
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"[login]\nbastion ansible_host=127.0.0.1 ansible_port=1\n\n[gpu]\n"
                         f"node-a ansible_host=127.0.0.1 ansible_port={n6.port}\n"
                         f"node-b ansible_host=127.0.0.1 ansible_port={n7.port}\n\n"
                         f"[gpu:vars]\nansible_user={ssh_fleet.user}\n")
    proc = gpuwarden("fleet", "status", "--hosts-from", str(inventory), "--group", "gpu", "--json",
                     env=env, timeout=60)
    nodes = rows(proc)
    assert sorted(nodes) == ["node-a", "node-b"]
    assert all(n["state"] == "ok" for n in nodes.values()), [n["reason"] for n in nodes.values()]

    config = tmp_path / "fleet.toml"
    config.write_text('[fleet]\nhosts = ["gpu0[7-8]"]\nparallel = 2\ntimeout = 30\n')
    proc = gpuwarden("fleet", "status", "--fleet-config", str(config), "--json", env=env, timeout=60)
    assert sorted(rows(proc)) == ["gpu07", "gpu08"]

    bad = gpuwarden("fleet", "status", "--hosts-from", str(inventory), "--group", "nope", env=env)
    assert bad.returncode == 2 and "no group 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    none = gpuwarden("fleet", "status", env={**env, "XDG_CONFIG_HOME": str(tmp_path / "empty")})
    assert none.returncode == 2 and "no nodes given" in none.stderr


def test_proxyjump_from_ssh_config(ssh_fleet, tmp_path):
    env = client_env(ssh_fleet)
    target = ssh_fleet.node("gpu08")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host behind-gpu01\n  HostName 127.0.0.1\n  Port {target.port}\n  ProxyJump gpu01\n"
                   f"Host loop\n  HostName 127.0.0.1\n  Port {target.port}\n  ProxyJump loop\n"
                   + ssh_fleet.ssh_config.read_text())
    proc = gpuwarden("fleet", "status", "--ssh-config", str(cfg), "--nodelist", "behind-gpu01,loop", "--json",
                     env=env, timeout=60)
    nodes = rows(proc)
    assert nodes["behind-gpu01"]["state"] == "ok", proc.stdout + proc.stderr
    assert "ProxyJump hops" in nodes["loop"]["reason"]  # a jump host that names itself does not recurse


@pytest.mark.slow
def test_drain_refused_without_terminal_then_dry_run_then_run_with_journal(ssh_fleet):
    n5 = ssh_fleet.node("gpu05")
    refused = fleet(ssh_fleet, "drain", "1", "--nodelist", "gpu[05-06]")
    assert refused.returncode == 1 and "--yes" in refused.stderr and "nothing was touched" in refused.stderr
    assert json.loads(node_cli(n5, "status", "--json", check=False).stdout)["drained"] == []

    plan = fleet(ssh_fleet, "drain", "1", "--nodelist", "gpu[05-06],gpu09", "--dry-run")
    assert plan.returncode == 2  # gpu09 could not be asked
    for name in ("gpu05", "gpu06"):
        assert f"{name} | drain: " in plan.stdout and f"{name} | " in plan.stdout
    assert "gpu09 | UNREACHABLE" in plan.stderr
    assert json.loads(node_cli(n5, "status", "--json", check=False).stdout)["drained"] == []

    try:
        done = fleet(ssh_fleet, "drain", "1", "--nodelist", "gpu[05-06]", "--yes", "--json", "--reason", "fleet test")
        assert done.returncode == 0, done.stdout + done.stderr
        lines = [json.loads(x) for x in done.stdout.splitlines()]
        for line in lines:
            jsondoc.validate(line)
        assert {x["node"] for x in lines if x["kind"] == "exit" and x["exit_code"] == 0} == {"gpu05", "gpu06"}
        for node in (n5, ssh_fleet.node("gpu06")):
            assert json.loads(node_cli(node, "status", "--json", check=False).stdout)["drained"] == [1]
        journal = read_journal(n5.state_dir)
        entry = next(e for e in journal if e["action"] == "drain" and e["result"] == "ok")
        assert entry["via"] == "fleet" and entry["operator"].endswith("@" + socket.gethostname())
    finally:
        undone = fleet(ssh_fleet, "undrain", "1", "--nodelist", "gpu[05-06]")
        assert undone.returncode == 0, undone.stdout + undone.stderr
    assert json.loads(node_cli(n5, "status", "--json", check=False).stdout)["drained"] == []


def test_black_holed_host_does_not_hold_up_the_fleet(ssh_fleet, tmp_path):
    port, close = black_hole()
    try:
        cfg = tmp_path / "ssh_config"
        cfg.write_text(f"Host hole\n  HostName 127.0.0.1\n  Port {port}\n" + ssh_fleet.ssh_config.read_text())
        proc = gpuwarden("fleet", "status", "--ssh-config", str(cfg), "--nodelist", "gpu01,hole", "--timeout", "4",
                         "--json", env=client_env(ssh_fleet), timeout=90)
    finally:
        close()
    doc = json.loads(proc.stdout)
    nodes = rows(proc)
    assert nodes["hole"]["state"] == "unreachable" and "within 4s" in nodes["hole"]["reason"], nodes["hole"]
    # The fan-out ends with its slowest node's deadline (bench_fleet.py measures the margin; a loaded CI
    # machine may be slow to wake the loop, so this only checks that the hole did not hold it up for long).
    assert doc["duration_s"] < 4 + 10, doc["duration_s"]


@pytest.mark.slow
def test_fleet_bundle_pulls_each_nodes_bundle_with_an_index(ssh_fleet, tmp_path):
    out = tmp_path / "incident"
    proc = fleet(ssh_fleet, "bundle", "--nodelist", "gpu02,gpu03,gpu09", "--output", str(out), "--safe-mode",
                 "--json", timeout=180)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # gpu09 could not be collected
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert doc == json.loads((out / "index.json").read_text())
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert not nodes["gpu09"]["ok"] and "connection refused" in nodes["gpu09"]["error"]
    import hashlib
    for name in ("gpu02", "gpu03"):
        item = nodes[name]
        assert item["ok"], item
        local = out / item["file"]
        assert local.stat().st_mode & 0o777 == 0o600
        assert hashlib.sha256(local.read_bytes()).hexdigest() == item["sha256"]
        assert item["remote_path"].startswith(str(ssh_fleet.node(name).state_dir))
    assert "fleet triage" in (out / "index.md").read_text().lower()
    again = fleet(ssh_fleet, "bundle", "--nodelist", "gpu02", "--output", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_purge_and_baseline_dry_runs_show_each_nodes_plan(ssh_fleet):
    plan = fleet(ssh_fleet, "purge", "--nodelist", "gpu01,gpu02", "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "gpu02 | " in plan.stdout and "gpu01 | " in plan.stdout and "(dry run): 2/2 node(s) ok" in plan.stdout
    base = fleet(ssh_fleet, "baseline", "--nodelist", "gpu01", "--dry-run", "--json")
    assert base.returncode == 0, base.stdout + base.stderr
    lines = [json.loads(x) for x in base.stdout.splitlines()]
    for line in lines:
        jsondoc.validate(line)
    assert lines[-1]["node"] == "gpu01" and lines[-1]["exit_code"] == 0
    assert not (ssh_fleet.node("gpu01").state_dir / "baseline.json").exists()


def test_status_watch_refreshes(ssh_fleet):
    import subprocess
    import sys
    from helpers.paths import REPO
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.tui.main", "fleet", "status", "--nodelist", "gpu01", "--watch",
                             "--json", "--interval", "1"], cwd=REPO, env={**os.environ, **client_env(ssh_fleet)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        docs = [json.loads(proc.stdout.readline()) for _ in range(2)]  # one document per refresh
    finally:
        proc.terminate()
        proc.wait(10)
    for doc in docs:
        jsondoc.validate(doc)
        assert doc["nodes"][0]["node"] == "gpu01" and doc["nodes"][0]["state"] == "ok"
    assert docs[1]["taken_at"] > docs[0]["taken_at"]


def test_nodes_sharing_an_address_are_each_a_node_and_repeats_are_named(ssh_fleet, tmp_path):
    """Issue 25 item 3: five `127.0.0.1:PORT` lines (four sshd, one black hole) are five nodes; one address with
    another user is another node; an identical line is a duplicate, said once with its line numbers."""
    n1, n2, n3, n5 = (ssh_fleet.node(n) for n in ("gpu01", "gpu02", "gpu03", "gpu05"))
    port, close = black_hole()
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"127.0.0.1:{p}\n" for p in (n1.port, n2.port, n3.port, n5.port, port))
                     + f"{ssh_fleet.user}@127.0.0.1:{n5.port}\n"   # line 6: the same sshd as another user
                     + f"127.0.0.1:{n2.port}   # line 7: line 2 again\n")
    try:
        proc = fleet(ssh_fleet, "status", "--hosts", str(hosts), "--json", "--timeout", "4")
    finally:
        close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    nodes = rows(proc)
    doc = json.loads(proc.stdout)
    at = "127.0.0.1:{}".format
    assert set(nodes) == {at(n1.port), at(n2.port), at(n3.port), at(n5.port), at(port),
                          f"{ssh_fleet.user}@{at(n5.port)}"}
    assert doc["counts"] == {"nodes": 6, "ok": 3, "attention": 2, "unreachable": 1, "error": 0}
    # Each row is its own node's answer, not one node's repeated.
    assert nodes[at(n2.port)]["residual_bytes"] == 3 * 2**30 and nodes[at(n3.port)]["engines"]["crashed"] == 1
    assert nodes[at(n1.port)]["state"] == "ok" and nodes[at(n5.port)]["state"] == "ok"
    assert nodes[at(port)]["state"] == "unreachable" and "within 4s" in nodes[at(port)]["reason"]
    assert nodes[f"{ssh_fleet.user}@{at(n5.port)}"]["target"] == f"{ssh_fleet.user}@{at(n5.port)}"
    assert doc["duplicates"] == [{"node": at(n2.port), "target": at(n2.port), "first": f"{hosts}:2",
                                  "repeats": [f"{hosts}:7"]}]
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert warnings == [f"gpuwarden: warning: 1 inventory entry names a node already named, asked once: "
                        f"{hosts}:7 repeats {hosts}:2 ({at(n2.port)})"], proc.stderr

    # A playbook's events and verdicts are per node too: two nodes on one address never overwrite each other.
    hosts.write_text(f"127.0.0.1:{n1.port}\n127.0.0.1:{n2.port}\n")
    plan = fleet(ssh_fleet, "purge", "--hosts", str(hosts), "--dry-run", "--json")
    assert plan.returncode in (0, 1), plan.stdout + plan.stderr
    ends = [e for e in map(json.loads, plan.stdout.splitlines()) if e["kind"] == "exit"]
    assert sorted(e["node"] for e in ends) == sorted([at(n1.port), at(n2.port)]), plan.stdout
