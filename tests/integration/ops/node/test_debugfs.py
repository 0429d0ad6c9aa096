"""The debugfs reader and parsers (ops/node/debugfs): only allow-listed files are ever opened, trigger files never
(proved with inotify over the sim node's debugfs tree while status, bundle, doctor, arena budget and the agent
run), links/FIFOs/oversized/slow files are refused within their bounds, and each file parses from the kernel's
own print format.
"""

from __future__ import annotations

import json
import os
import threading
import time


from gpuwarden.ops.node.debugfs import allowlist, parse
from gpuwarden.ops.foundation.deadline import Lanes
from gpuwarden.ops.node.debugfs.reader import DebugfsReader
from helpers.files import tree
from helpers.inotify_watch import OpenWatch
from helpers.simnode import wait_for

MIB = 1 << 20


def test_a_symlink_to_a_trigger_is_never_followed(tmp_path):
    tree(tmp_path, {"dri/0/amdgpu_gpu_recover": "boom\n"})
    os.symlink("amdgpu_gpu_recover", tmp_path / "dri/0/amdgpu_vram_mm")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "dri/0", tmp_path / "dri/1")
    watch = OpenWatch(tmp_path)
    try:
        assert DebugfsReader(tmp_path).read("vram_mm", 0).status == "refused"
        assert DebugfsReader(tmp_path).read("vram_mm", 1).status == "refused"  # a linked directory
        assert not [p for p in watch.drain() if p.name == "amdgpu_gpu_recover"]
    finally:
        watch.close()


def test_not_root_opens_nothing(tmp_path, monkeypatch):
    tree(tmp_path, {"kfd/mem_limit": "System mem used 1M out of 2M\n"})
    watch = OpenWatch(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    try:
        assert DebugfsReader(tmp_path).read("kfd_mem_limit").status == "not-root"
        assert watch.drain() == []
    finally:
        watch.close()


BUDDY = "chunk_size: 4KiB, total: 65520MiB, free: {free}MiB\norder- 8 free:      512 MiB, blocks: 512\n"


def test_books_of_a_hung_vram_manager_keep_the_other_gpus_and_hold_one_thread(tmp_path):
    from gpuwarden.ops.node.debugfs import books
    tree(tmp_path, {"kfd/mem_limit": "System mem used 1M out of 2M\n", "dri/0/amdgpu_vram_mm": BUDDY.format(free=600),
                    "dri/1/amdgpu_vram_mm": BUDDY.format(free=700)})
    let_go = threading.Event()
    calls = []

    class Hung(DebugfsReader):
        """GPU 1's VRAM manager lock is held (a hung GPU): its read blocks in the kernel until the driver lets go."""

        def read_inline(self, name, minor=None):
            if (name, minor) == ("vram_mm", 1):
                calls.append(minor)
                let_go.wait(30)
            return super().read_inline(name, minor)
    kept = books.Books(Hung(tmp_path, timeout_s=0.3), lanes=Lanes())
    try:
        t0 = time.monotonic()
        late = kept.read([0, 1])
        assert time.monotonic() - t0 < 2.0
        assert [v["gpu"] for v in late["vram_free"]] == [0] and late["kfd_mem_limit"] is not None
        t0 = time.monotonic()
        still = kept.read([0, 1])  # the lane is still blocked: answered at once, no second reader started
        assert time.monotonic() - t0 < 0.25 and [v["gpu"] for v in still["vram_free"]] == [0] and calls == [1]
        everything_late = books.Books(Hung(tmp_path / "none", timeout_s=0.3), lanes=Lanes()).read([1])
        assert "did not answer in time" in everything_late["vram_free_unavailable"]
    finally:
        let_go.set()
    assert wait_for(lambda: [v["gpu"] for v in kept.read([0, 1])["vram_free"]] == [0, 1])


# --- gpuwarden never opens a trigger file -------------------------------------------------------------

def test_no_command_ever_opens_a_trigger_file(cli, state_dir, tmp_path):
    assert cli("sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    debug = state_dir / "sim/root/sys/kernel/debug"
    triggers = {debug / t.format(minor=i) for t in allowlist.TRIGGERS for i in (0, 1)}
    assert all(p.is_file() for p in triggers)
    (state_dir / "node.toml").write_text(
        '[arena]\npath = "/dev/shm/gw-dbg-none.arena"\nsize = "1GiB"\n\n'
        '[[engines]]\nname = "dp0"\ngpu = 0\nargv = ["/bin/sleep", "600"]\n')
    watch = OpenWatch(debug)
    try:
        env = {"GPUWARDEN_BACKEND": "sim"}
        runs = [("status", "--json"), ("status",), ("doctor", "--json"),
                ("--config", str(state_dir / "node.toml"), "arena", "budget", "--json"),
                ("bundle", "--output", f"{tmp_path}/", "--json"),
                ("--config", str(state_dir / "node.toml"), "launch", "--dry-run")]
        for args in runs:
            proc = cli(*args, env=env, timeout=120)
            assert proc.returncode in (0, 1), (args, proc.stderr)
        from helpers.agentnode import start_agent
        from helpers.simnode import wait_for
        agent = start_agent(state_dir)
        try:  # a few refreshes of the agent's sampler, its API and /metrics
            wait_for(lambda: (agent.json("/v1/snapshot").get("gpus") or [{}])[0].get("driver", {})
                     .get("kfd_mem_limit") is not None, timeout=20)
            assert agent.get("/metrics").status == 200
        finally:
            agent.stop()
        opened = {p for p in watch.drain() if not p.is_dir()}  # the reader opens each directory on the way
        assert debug / "kfd/mem_limit" in opened  # the watch sees reads: gpuwarden does read debugfs
        assert debug / "dri/0/amdgpu_vram_mm" in opened
        assert not opened & triggers, sorted(opened & triggers)
        assert opened <= {debug / allowlist.relative_path(n, i if "{minor}" in t[0] else None)
                          for n, t in allowlist.ALLOWED.items() for i in (0, 1)}
    finally:
        watch.close()


def test_status_json_carries_the_drivers_books(cli, state_dir):
    from gpuwarden.ops.foundation import jsondoc
    assert cli("sim", "init", "--gpus", "2", "--vram", "8GiB").returncode == 0
    assert cli("sim", "fault", "vram-fragmented", "on").returncode == 0
    doc = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    jsondoc.validate(doc)
    # Each GPU record carries its books (a top-level object would break strict readers of snapshot/1); KFD's limit
    # is node-wide, the same in every GPU's.
    assert "driver" not in doc
    books = [g["driver"] for g in doc["gpus"]]
    d = books[0]
    assert d["kfd_mem_limit"]["system_used"] == 0 and d["kfd_mem_limit"]["system_limit"] > 0
    assert books[1]["kfd_mem_limit"] == d["kfd_mem_limit"]
    assert d["vram_free"]["largest_free_block"] == 2 * MIB and d["vram_free"]["fragmentation"] > 0.99
    from gpuwarden.ops.foundation.model import snapshot_from_dict
    again = snapshot_from_dict(doc).driver  # what the TUI, /metrics and history read from an agent's document
    assert [v["gpu"] for v in again["vram_free"]] == [0, 1] and again["kfd_mem_limit"] == d["kfd_mem_limit"]


def test_budget_doctor_and_launch_use_kfds_own_limit_and_name_the_crossing_registration(cli, state_dir, tmp_path):
    from gpuwarden.ops.foundation import jsondoc
    assert cli("sim", "init", "--gpus", "4", "--vram", "8GiB").returncode == 0
    limit_line = (state_dir / "sim/root/sys/kernel/debug/kfd/mem_limit").read_text().splitlines()[0]
    limit = int(limit_line.split("out of ")[1].rstrip("M")) * MIB
    size = (limit // 3) & ~((1 << 30) - 1) or (1 << 30)  # three engines fit, the fourth crosses
    cfg = state_dir / "node.toml"
    cfg.write_text(f'[arena]\npath = "/dev/shm/gw-dbg-none.arena"\nsize = "{size}B"\n\n' + "".join(
        f'[[engines]]\nname = "dp{i}"\ngpu = {i}\nargv = ["/bin/sleep", "600"]\n\n' for i in range(4)))
    proc = cli("--backend", "sim", "--config", str(cfg), "arena", "budget", "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    jsondoc.validate(doc)
    assert doc["limit_source"] == "debugfs" and doc["limit"] == limit and doc["kfd_used"] == 0
    assert doc["crossing"].startswith("engine dp3's ") and "set amdgpu.no_system_mem_limit=1 (runtime-writable)" \
        in doc["crossing"]
    assert "arena-alt-vmm-host-fd" in [k["id"] for k in doc["known"]]
    text = cli("--backend", "sim", "--config", str(cfg), "arena", "budget").stdout
    assert "read from debugfs" in text and "warning: engine dp3's" in text
    d = json.loads(cli("--backend", "sim", "--config", str(cfg), "doctor", "--json", "--only", "kfd-limit").stdout)
    (check,) = d["checks"]
    assert check["verdict"] == "warn" and "engine dp3's" in check["reason"]
    assert "no_system_mem_limit" in check["fix"] and check["known"]


def test_an_idle_gpu_reads_unfragmented_whatever_its_size(cli, state_dir):
    # drm_buddy_init makes one root per set bit of the size (drivers/gpu/drm/drm_buddy.c): an idle 24 GiB manager is
    # a 16 GiB and an 8 GiB block, which 1 - largest/free called 33% fragmented (issue 35).
    assert cli("sim", "init", "--gpus", "1", "--vram", "24GiB").returncode == 0
    doc = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    v = doc["gpus"][0]["driver"]["vram_free"]
    assert v["free_blocks"] == 2 and v["largest_free_block"] == 16 << 30 and v["fragmentation"] == 0.0
    # An MI210-like manager of 65520 MiB has 12 roots: still 0 when idle (the old ratio read 0.50).
    idle = "chunk_size: 4KiB, total: 65520MiB, free: 65520MiB, clear_free: 0MiB\n" + "".join(
        f"order-{o:2d} free: {(4096 << o) >> 20:8d} MiB, blocks: {(65520 * MIB // 4096) >> o & 1}\n"
        for o in range(23, 7, -1))
    v = parse.vram_mm(idle.encode())
    assert v.free_blocks == 12 and v.largest_free_block == 32 << 30 and v.fragmentation == 0.0
    # Half the best block is a real split (0.5); 2 MiB crumbs read near 1.
    half = "chunk_size: 4KiB, total: 24576MiB, free: 16384MiB\norder-21 free:     16384 MiB, blocks: 2\n"
    assert parse.vram_mm(half.encode()).fragmentation == 0.5
    assert cli("sim", "fault", "vram-fragmented", "on").returncode == 0
    doc = json.loads(cli("--backend", "sim", "status", "--json").stdout)
    assert doc["gpus"][0]["driver"]["vram_free"]["fragmentation"] > 0.999
