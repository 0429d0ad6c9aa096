"""Fleet inventories without SSH: hosts files, Slurm hostlists, Ansible INI groups, the fleet config; fleet triage."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.ops.foundation.errors import ConfigError, GpuwardenError, NotFound
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


# --- issue 25 item 3: one address, several nodes; only identical entries are duplicates -------------------------

def test_lines_sharing_an_address_are_distinct_nodes_with_names_that_tell_them_apart(tmp_path):
    from gpuwarden.ops.fleet.inventory import distinct
    f = tmp_path / "hosts"
    f.write_text("127.0.0.1:2201\n127.0.0.1:2202\n127.0.0.1:2203\n127.0.0.1:2204\n127.0.0.1:2299\n"
                 "ops@127.0.0.1:2201\nroot@127.0.0.1:2201\n127.0.0.1\ngpu01\n")
    inv = distinct(read_hosts_file(f))
    names = [h.name for h in inv.hosts]
    assert names == ["127.0.0.1:2201", "127.0.0.1:2202", "127.0.0.1:2203", "127.0.0.1:2204", "127.0.0.1:2299",
                     "ops@127.0.0.1:2201", "root@127.0.0.1:2201", "127.0.0.1", "gpu01"]
    assert inv.duplicates == () and inv.warning() is None
    # ssh still connects to the address, with the line's own user and port.
    assert [(h.address, h.user, h.port) for h in inv.hosts[4:7]] == \
        [("127.0.0.1", None, 2299), ("127.0.0.1", "ops", 2201), ("127.0.0.1", "root", 2201)]
    assert inv.hosts[6].target == "root@127.0.0.1:2201" and inv.hosts[-1] == Host("gpu01")  # alone: unchanged
    # Every consumer keyed by the node's name sees each node once.
    from gpuwarden.ops.fleet.monitor import FleetMonitor
    from gpuwarden.ops.fleet.ssh import SshSettings
    assert len(FleetMonitor(list(inv.hosts), SshSettings(), lambda *a: "true").feeds) == 9


def test_only_identical_entries_are_duplicates_and_their_lines_are_named(tmp_path):
    from gpuwarden.ops.fleet.inventory import distinct
    f = tmp_path / "hosts"
    f.write_text("127.0.0.1:2201\n"          # 1
                 "gpu[01-03]\n"              # 2
                 "ops@127.0.0.1:2201\n"      # 3
                 "  127.0.0.1:2201   # again, spaced and commented\n"  # 4: same node as line 1
                 "GPU02\n"                   # 5: a DNS name is case-blind: gpu02 again
                 "[::1]:22\n"                # 6
                 "[0:0::1]:22\n"             # 7: the same IPv6 address spelled longer
                 "gpu01:22\n")               # 8: not gpu01: ssh config may give gpu01 another Port
    inv = distinct(read_hosts_file(f))
    assert [h.name for h in inv.hosts] == ["127.0.0.1:2201", "gpu01", "gpu02", "gpu03", "ops@127.0.0.1:2201",
                                           "::1", "gpu01:22"]
    assert [(d.node, d.first, d.repeats) for d in inv.duplicates] == [
        ("127.0.0.1:2201", f"{f}:1", (f"{f}:4",)), ("gpu02", f"{f}:2", (f"{f}:5",)), ("::1", f"{f}:6", (f"{f}:7",))]
    warning = inv.warning()
    assert "\n" not in warning and warning.startswith("3 inventory entries name a node already named")
    assert f"{f}:4 repeats {f}:1 (127.0.0.1:2201)" in warning and f"{f}:7 repeats {f}:6 (::1)" in warning
    assert inv.duplicates[0].to_dict() == {"node": "127.0.0.1:2201", "target": "127.0.0.1:2201",
                                           "first": f"{f}:1", "repeats": [f"{f}:4"]}
    # A whole range given twice: one clause per pair of lines, the nodes counted, not listed without end.
    f.write_text("n[1-40]\nn[1-40]\n")
    inv = distinct(read_hosts_file(f))
    assert len(inv.hosts) == 40 and len(inv.duplicates) == 40
    assert inv.warning() == (f"40 inventory entries name a node already named, asked once: {f}:2 repeats {f}:1 "
                             "(n1, n2, n3 and 37 more)")


def test_one_name_from_two_inventories_reaching_two_addresses_is_two_nodes(tmp_path):
    from gpuwarden.ops.fleet.inventory import distinct
    inv = tmp_path / "inventory.ini"
    inv.write_text("[gpu]\ngpu01 ansible_host=10.0.0.5\ngpu02\n")
    hosts = distinct([Host("gpu01", source="--nodelist"), Host("gpu02", source="--nodelist"), *read_group(inv, "gpu")])
    assert [h.name for h in hosts.hosts] == ["gpu01 (gpu01)", "gpu02", "gpu01 (10.0.0.5)"]
    assert [d.repeats for d in hosts.duplicates] == [(f"{inv}:3",)]  # gpu02 is gpu02 wherever it is named


def test_prometheus_series_shared_by_several_nodes_vouch_for_none_and_discovery_keeps_every_instance():
    from gpuwarden.ops.fleet.promfleet import Exporter, _discovered, _match
    a = Exporter("gpuwarden", "127.0.0.1:9401", hostname="node-a", ts=1.0)
    b = Exporter("gpuwarden", "127.0.0.1:9402", hostname="node-b", ts=2.0)
    c = Exporter("gpuwarden", "gpu07:9400", ts=1.0)
    found = _discovered([a, b, c])
    assert found == [Host("127.0.0.1:9401", address="127.0.0.1"), Host("127.0.0.1:9402", address="127.0.0.1"),
                     Host("gpu07")]
    assert [_match(h, [a, b, c]) for h in found] == [a, b, c]  # each discovered node is its own instance


def test_bundle_directories_are_one_path_component_per_node():
    from gpuwarden.playbooks.fleet.bundles import node_dir
    assert node_dir("root@127.0.0.1:2201") == "root@127.0.0.1:2201"
    assert node_dir("../../etc") == ".._.._etc" and node_dir("..") == "_.."


# --- issue 25 item 7: host ranges have a cap, counted before anything expands ----------------------------------

def test_hostlists_are_sized_by_arithmetic_before_they_expand():
    from gpuwarden.ops.fleet.hostlist import nodeset_size
    assert nodeset_size("gpu[01-16],gpu-b[1-4]") == 20
    assert nodeset_size("n[1-1000]x[1-1000]y[1-1000]") == 10**9
    assert nodeset_size("n[1-10/3],m[-8--4],solo") == 4 + 5 + 1
    assert nodeset_size("n[1-10]!n[3-4]") == 12  # the difference still builds both sides
    for bad in ("gpu[01-", "gpu]1[", "gpu[1-4/0]", "gpu[a-c]"):
        with pytest.raises(GpuwardenError, match="not a hostlist"):
            nodeset_size(bad)
    # What ClusterShell expands agrees with the count wherever the count is exact.
    for pattern in ("gpu[01-16],gpu-b[1-4]", "n[1-10/3],m[2-3]x[1-2]", "a,b,c"):
        assert len(expand_nodelist(pattern)) == nodeset_size(pattern)


def test_the_host_cap_holds_for_one_range_and_for_the_fleet_in_all(tmp_path):
    import time
    from gpuwarden.ops.fleet.hostlist import MAX_HOSTS, HostBudget
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"--nodelist 'gpu\[1-99999999\]' names 99,999,999 hosts, more than the "
                                          r"5,000 a fleet command takes"):
        expand_nodelist("gpu[1-99999999]")
    f = tmp_path / "hosts"
    f.write_text("gpu[1-4000]\nops@spare[1-2000]:2200\n")
    with pytest.raises(ConfigError, match=rf"{f}:2: 'spare\[1-2000\]' brings the fleet to 6,000 hosts"):
        read_hosts_file(f)
    f.write_text("a\n" * (MAX_HOSTS + 1))
    with pytest.raises(ConfigError, match=rf"{f}:{MAX_HOSTS + 1} brings the fleet to {MAX_HOSTS + 1:,} hosts"):
        read_hosts_file(f)
    # --hosts and --nodelist share one budget.
    budget = HostBudget()
    f.write_text("gpu[1-3000]\n")
    read_hosts_file(f, budget)
    with pytest.raises(ConfigError, match="brings the fleet to 6,000 hosts"):
        expand_nodelist("n[1-3000]", budget)
    inv = tmp_path / "inventory.ini"
    inv.write_text("[gpu]\nn[1:99999999]\n")
    with pytest.raises(ConfigError, match=r"inventory.ini:2: 'n\[1:99999999\]' names 99,999,999 hosts, more than the 5,000"):
        read_group(inv, None)
    # A host in many groups is one host: lines may name it again, up to ten entries per host in all.
    inv.write_text("".join(f"[g{i}]\nn[1:3000]\n" for i in range(8)))
    assert len(read_group(inv, None)) == 3000
    inv.write_text("".join(f"[g{i}]\nn[1:3000]\n" for i in range(20)))
    with pytest.raises(ConfigError, match="host entries, more than the 50,000"):
        read_group(inv, None)
    assert time.monotonic() - started < 10


def test_inventories_are_regular_files_read_bounded(tmp_path):
    import os
    from gpuwarden.ops.fleet.inventory import INVENTORY_LIMIT
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, r"a FIFO \(named pipe\)"), (Path("/dev/zero"), "a character device"),
                       (tmp_path, "a directory")):
        for read in (read_hosts_file, lambda p: read_group(p, None),
                     lambda p: load_fleet_config(p, explicit=True)):
            with pytest.raises(GpuwardenError, match=f"{path} is {kind}, not a regular file") as err:
                read(path)
            assert "write the list to a file" in err.value.hint
    big = tmp_path / "big"
    with open(big, "wb") as out:
        out.truncate(INVENTORY_LIMIT + 1)
    with pytest.raises(GpuwardenError, match="larger than a hosts file can be"):
        read_hosts_file(big)
    big.write_bytes(b"gpu01\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=rf"{big}:2: the hosts file is not UTF-8 text"):
        read_hosts_file(big)
