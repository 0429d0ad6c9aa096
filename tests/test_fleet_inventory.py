"""Fleet inventories without SSH: hosts files, Slurm hostlists, Ansible INI groups, the fleet config; fleet triage."""

from __future__ import annotations

import pytest

from gpuwarden.ops.errors import ConfigError, GpuwardenError, NotFound
from gpuwarden.ops.fleet.ansible import expand_range, read_group
from gpuwarden.ops.fleet.inventory import Host, expand_nodelist, load_fleet_config, parse_target, read_hosts_file


def test_slurm_hostlist_expands_ranges_and_lists():
    assert expand_nodelist("gpu[01-03],gpu-b[1-2]") == ["gpu01", "gpu02", "gpu03", "gpu-b1", "gpu-b2"]
    assert expand_nodelist("n[1,3,5-6]") == ["n1", "n3", "n5", "n6"]
    with pytest.raises(GpuwardenError, match="not a hostlist"):
        expand_nodelist("gpu[01-")


def test_targets_and_hosts_file(tmp_path):
    assert parse_target("root@gpu01:2222") == Host("gpu01", "root", 2222)
    assert parse_target("[::1]:22") == Host("::1", None, 22)
    with pytest.raises(ValueError):
        parse_target("gpu01:ssh")
    f = tmp_path / "hosts"
    f.write_text("# lab\n  gpu01  # first\nops@gpu[02-03]:2200\n\n[fe80::1]\n")
    assert read_hosts_file(f) == [Host("gpu01"), Host("gpu02", "ops", 2200), Host("gpu03", "ops", 2200),
                                  Host("fe80::1")]
    f.write_text("gpu01\nbad host name\n")
    with pytest.raises(ConfigError, match=r"hosts:2: "):
        read_hosts_file(f)
    with pytest.raises(NotFound):
        read_hosts_file(tmp_path / "missing")


def test_ansible_groups_children_vars_and_ranges(tmp_path):
    inv = tmp_path / "inventory.ini"
    inv.write_text("bastion ansible_host=10.0.0.1\n\n[gpu]\ngpu[01:03] ansible_user=ops\n"
                   "gpu-b1:2222 ansible_host=10.0.0.5\n\n[amd]\nmi-[a:b]\n\n[compute:children]\ngpu\namd\n\n"
                   "[gpu:vars]\nansible_port=2201\n; a comment\n")
    gpu = read_group(inv, "gpu")
    assert gpu[0] == Host("gpu01", "ops", 2201)
    assert gpu[-1] == Host("gpu-b1", None, 2222, "10.0.0.5")  # the host line's port beats the group's
    assert [h.name for h in read_group(inv, "compute")] == ["gpu01", "gpu02", "gpu03", "gpu-b1", "mi-a", "mi-b"]
    assert read_group(inv, None)[0] == Host("bastion", None, None, "10.0.0.1")
    with pytest.raises(NotFound, match="groups there: amd, compute, gpu"):
        read_group(inv, "nope")
    assert expand_range("n[08:10:2].x", "") == ["n08.x", "n10.x"]


def test_fleet_config(tmp_path):
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[fleet]\nhosts = ["gpu[1-2]", "root@spare:2200"]\ncommand = "sudo -n gpuwarden"\nparallel = 4\n')
    loaded = load_fleet_config(cfg, explicit=True)
    assert [h.name for h in loaded.hosts] == ["gpu1", "gpu2", "spare"] and loaded.hosts[2].port == 2200
    assert loaded.command == "sudo -n gpuwarden" and loaded.parallel == 4
    assert load_fleet_config(tmp_path / "none.toml", explicit=False).hosts == ()
    cfg.write_text('[fleet]\nhost = ["x"]\n')
    with pytest.raises(ConfigError, match="unknown key"):
        load_fleet_config(cfg, explicit=True)
    cfg.write_text('[fleet]\nprometheus = "http://prom:9090"\nprometheus_selector = \'job="gpuwarden"\'\n'
                   'prometheus_max_age = 90\n')
    loaded = load_fleet_config(cfg, explicit=True)
    assert (loaded.prometheus, loaded.prometheus_selector, loaded.prometheus_max_age) == \
        ("http://prom:9090", 'job="gpuwarden"', 90.0)
    cfg.write_text('[fleet]\nprometheus_max_age = -1\n')
    with pytest.raises(ConfigError, match="prometheus_max_age must be seconds"):
        load_fleet_config(cfg, explicit=True)


def test_fleet_triage_groups_the_same_fault_across_nodes():
    from gpuwarden.playbooks.fleet.bundles import PulledBundle, fleet_triage
    from gpuwarden.ops.triage import analyze_text

    def node(name: str, bus: str, lines: list[str]) -> PulledBundle:
        text = "".join(f"Dec  1 09:00:0{i} {name} kernel: {line}\n" for i, line in enumerate(lines))
        return PulledBundle(Host(name), findings=analyze_text(text, source=name).findings)

    xid = "NVRM: Xid (PCI:{bus}): 79, pid=123, GPU has fallen off the bus."
    segv = ("python3[{pid}]: segfault at 8 ip 00007f1234567890 sp 00007ffd00000000 error 6 in "
            "libamdhip64.so.7[3ca89d,7f1234000000+430000]")
    pulled = [node(f"gpu0{i}", f"0000:{i}b:00", [xid.format(bus=f"0000:{i}b:00")]) for i in range(1, 6)]
    for p, pid in zip(pulled[:3], (11, 22, 33)):
        p.findings += analyze_text(f"Dec  1 09:00:09 x kernel: {segv.format(pid=pid)}\n", source="x").findings
    groups = fleet_triage(pulled)
    assert groups[0]["category"] == "xid" and len(groups[0]["nodes"]) == 5 and "Xid 79 on 5 nodes" in groups[0]["title"]
    crash = next(g for g in groups if g["category"] == "segfault")
    assert crash["nodes"] == ["gpu01", "gpu02", "gpu03"] and "libamdhip64.so.7+0x3ca89d" in crash["title"]


def test_rows_read_old_and_agent_era_snapshots():
    from gpuwarden.ops.fleet.fanout import HostResult
    from gpuwarden.ops.fleet.summary import from_snapshot
    result = HostResult(Host("gpu01"), 0)
    old = {"gpus": [{}], "residual": [], "engines": [], "warnings": ["SIMULATED node"], "backend": "sim"}
    assert from_snapshot(result, old).agent is None and from_snapshot(result, old).warnings == ("SIMULATED node",)
    new = {**old, "schema": "gpuwarden.snapshot/1", "warnings": [{"code": "simulated", "message": "SIMULATED node"}]}
    assert from_snapshot(result, new).agent is False and from_snapshot(result, new).warnings == ("SIMULATED node",)
    served = {**new, "agent": {"pid": 7, "interval_s": 1.0, "age_s": 0.2, "stale": False}, "needs_attention": True}
    row = from_snapshot(result, served)
    assert row.agent is True and row.state == "attention" and row.cells()["agent"] == "up"
