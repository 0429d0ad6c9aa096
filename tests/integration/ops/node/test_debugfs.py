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
from pathlib import Path

import pytest

from gpuwarden.ops.node.debugfs import allowlist, parse
from gpuwarden.ops.foundation.deadline import Lanes
from gpuwarden.ops.node.debugfs.reader import DebugfsReader
from helpers.inotify_watch import OpenWatch
from helpers.simnode import wait_for

MIB = 1 << 20


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


# --- the allow-list --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,minor", [("../kfd/mem_limit", None), ("amdgpu_gpu_recover", 0), ("gem_info", "0"),
                                        ("gem_info", True), ("gem_info", -1), ("gem_info", None),
                                        ("kfd_mem_limit", 0), ("vram_mm", 1 << 30)])
def test_anything_off_the_list_is_refused_before_the_filesystem(name, minor, tmp_path):
    with pytest.raises(ValueError):
        DebugfsReader(tmp_path).read(name, minor)


def test_no_trigger_file_can_be_named_through_the_allow_list():
    allowed = {allowlist.relative_path(n, 0 if "{minor}" in t[0] else None) for n, t in allowlist.ALLOWED.items()}
    triggers = {t.format(minor=0) for t in allowlist.TRIGGERS}
    assert not allowed & triggers
    assert all("*" not in t[0] and "?" not in t[0] for t in allowlist.ALLOWED.values())


# --- the reader's bounds ---------------------------------------------------------------------------

def test_reads_an_allowed_file_and_says_absent_for_a_missing_one(tmp_path):
    tree(tmp_path, {"kfd/mem_limit": "System mem used 10M out of 100M\nTTM mem used 1M out of 50M\n"})
    r = DebugfsReader(tmp_path).read("kfd_mem_limit")
    assert r.ok and parse.mem_limit(r.data).system_limit == 100 * MIB
    missing = DebugfsReader(tmp_path).read("vram_mm", 3)
    assert missing.status == "absent" and "not there" in missing.why()
    assert DebugfsReader(tmp_path / "nope").read("kfd_mem_limit").status == "absent"


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


def test_a_fifo_is_refused_without_blocking(tmp_path):
    (tmp_path / "kfd").mkdir()
    os.mkfifo(tmp_path / "kfd/mem_limit")
    t0 = time.monotonic()
    assert DebugfsReader(tmp_path, timeout_s=5).read("kfd_mem_limit").status == "refused"
    assert time.monotonic() - t0 < 1


def test_size_is_capped(tmp_path):
    tree(tmp_path, {"dri/0/amdgpu_gem_info": "x" * 5000})
    r = DebugfsReader(tmp_path, max_bytes=4096).read("gem_info", 0)
    assert r.status == "too-big" and r.data is None


def test_a_read_that_hangs_is_abandoned_at_its_deadline(tmp_path, monkeypatch):
    tree(tmp_path, {"kfd/mem_limit": "System mem used 1M out of 2M\n"})
    reader = DebugfsReader(tmp_path, timeout_s=0.3)
    # A hung driver blocks the read in the kernel; so does a read of an empty pipe until its writer acts.
    hung, driver = os.pipe()
    entered, returned = threading.Event(), threading.Event()
    real = os.read

    def stuck(fd, n):
        entered.set()
        try:
            return real(hung, n)
        finally:
            returned.set()
    monkeypatch.setattr(os, "read", stuck)
    try:
        t0 = time.monotonic()
        r = reader.read("kfd_mem_limit")
        assert r.status == "timeout" and time.monotonic() - t0 < 1.0 and "did not answer" in r.why()
        assert entered.wait(10) and not returned.is_set()  # abandoned while still blocked in its read
    finally:
        os.close(driver)  # the "driver" lets go (end of file): the abandoned reader finishes and closes its fd
        assert returned.wait(10)
        os.close(hung)


def test_not_root_opens_nothing(tmp_path, monkeypatch):
    tree(tmp_path, {"kfd/mem_limit": "System mem used 1M out of 2M\n"})
    watch = OpenWatch(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    try:
        assert DebugfsReader(tmp_path).read("kfd_mem_limit").status == "not-root"
        assert watch.drain() == []
    finally:
        watch.close()


# --- the kernel's print formats ----------------------------------------------------------------------

GEM_OLD = ("pid     4242 command python3:\n"
           "\t\t0x00000001:   2097152 byte VRAM pin count 1 NO_CPU_ACCESS CPU_GTT_USWC\n"
           "\t\t0x00000002:      4096 byte  GTT CPU_GTT_USWC\n"
           "pid     4243 command <unknown>:\n"
           "\t\t0x00000001:   1048576 byte VRAM exported as ino:12345 NO_CPU_ACCESS\n"
           "pid     4242 command python3:\n"
           "\t\t0x00000001:   1048576 byte VRAM VISIBLE CPU_ACCESS_REQUIRED\n")


def test_gem_info_sums_per_process_across_its_drm_files():
    clients = parse.gem_info(GEM_OLD.encode())
    assert [c.pid for c in clients] == [4242, 4243, 4242]
    h = parse.holders(clients)
    assert h[4242]["vram_bytes"] == 3 * MIB and h[4242]["gtt_bytes"] == 4096 and h[4242]["clients"] == 2
    assert h[4243]["command"] == "<unknown>" and h[4243]["vram_bytes"] == MIB
    assert clients[0].pinned_bytes == 2 * MIB


def test_vm_info_totals_per_state():
    text = ("pid:3140\tProcess:GeckoMain ----------\n\tIdle BOs:\n"
            "\t\t0x00000000:         4096 byte VRAM CPU_GTT_USWC\n\tEvicted BOs:\n"
            "\t\t0x00000001:      2097152 byte  GTT CPU_ACCESS_REQUIRED\n\tRelocated BOs:\n\tMoved BOs:\n"
            "\tInvalidated BOs:\n\tDone BOs:\n"
            "\tTotal idle size:                4096\tobjs:\t1\n\tTotal evicted size:          2097152\tobjs:\t1\n"
            "\tTotal relocated size:              0\tobjs:\t0\n\tTotal moved size:                  0\tobjs:\t0\n"
            "\tTotal invalidated size:            0\tobjs:\t0\n\tTotal done size:                   0\tobjs:\t0\n")
    (vm,) = parse.vm_info(text.encode())
    assert vm.process == "GeckoMain" and vm.sizes["evicted"] == 2 * MIB and vm.objects["idle"] == 1


def test_vram_mm_buddy_and_drm_mm():
    buddy = ("  use_type: 1\n  use_tt: 0\n  size: 68702699520\n  vis usage:0\ndefault_page_size: 4KiB\n"
             "chunk_size: 4KiB, total: 65520MiB, free: 1000MiB\n"
             "order-24 free:        0 MiB, blocks: 0\norder- 8 free:      512 MiB, blocks: 512\n"
             "order- 0 free:      488 MiB, blocks: 124928\nreserved:\n")
    v = parse.vram_mm(buddy.encode())
    assert v.allocator == "drm_buddy" and v.free == 1000 * MIB and v.largest_free_block == MIB
    assert v.fragmentation == pytest.approx(1 - 1 / 512, abs=1e-3)  # 1 MiB, where 1000 MiB free could form 512 MiB
    mm = ("0x0000000000000000-0x0000000000000100: 256: used\n0x0000000000000100-0x0000000000000200: 256: free\n"
          "0x0000000000000200-0x0000000000000300: 256: used\n0x0000000000000300-0x0000000000000700: 1024: free\n"
          "total: 1792, used 512 free 1280\n")
    v = parse.vram_mm(mm.encode())
    assert v.allocator == "drm_mm" and v.free == 1280 * 4096 and v.largest_free_block == 1024 * 4096
    assert v.fragmentation == pytest.approx(0.2)
    assert parse.vram_mm(b"nothing known\n") is None


BUDDY = "chunk_size: 4KiB, total: 65520MiB, free: {free}MiB\norder- 8 free:      512 MiB, blocks: 512\n"


def test_books_refresh_after_refresh_say_what_one_read_says_and_parse_a_file_again_only_when_it_changed(
        tmp_path, monkeypatch):
    from gpuwarden.ops.node.debugfs import books
    tree(tmp_path, {"kfd/mem_limit": "System mem used 1M out of 2M\n", "dri/0/amdgpu_vram_mm": BUDDY.format(free=600),
                    "dri/1/amdgpu_vram_mm": BUDDY.format(free=700)})
    reader = DebugfsReader(tmp_path)
    kept = books.Books(reader, lanes=Lanes())
    parsed = []
    real = parse.vram_mm
    monkeypatch.setattr(parse, "vram_mm", lambda data: parsed.append(data) or real(data))
    first = kept.read([0, 1])
    assert first == books.read(reader, [0, 1]) and [v["free"] for v in first["vram_free"]] == [600 * MIB, 700 * MIB]
    assert first["kfd_mem_limit"]["system_limit"] == 2 * MIB
    del parsed[:]
    assert kept.read([0, 1]) == first and parsed == []  # the same bytes: nothing parsed again
    (tmp_path / "dri/1/amdgpu_vram_mm").write_text(BUDDY.format(free=800))
    again = kept.read([0, 1])
    assert len(parsed) == 1 and [v["free"] for v in again["vram_free"]] == [600 * MIB, 800 * MIB]


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


def test_mem_limit_ignores_what_it_does_not_know():
    assert parse.mem_limit(b"System mem used -3M out of 100M\nextra line\n").system_used == 0
    assert parse.mem_limit(b"garbage\n") is None


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


def test_gem_info_names_the_holders_of_residual_vram_kfd_cannot(tmp_path):
    from gpuwarden.ops.foundation.model import GpuProcess, Residual, SnapshotWarning
    from gpuwarden.ops.sampling.sampler import Sampler
    tree(tmp_path, {"dri/1/amdgpu_gem_info": GEM_OLD})
    s = Sampler.__new__(Sampler)  # only the debugfs half of a sampler: no backend needed
    s._debugfs = DebugfsReader(tmp_path)
    leak = Residual(gpu_index=1, device_used=8 * MIB, accounted=MIB, baseline=None, residual=7 * MIB, significant=True)
    fine = Residual(gpu_index=0, device_used=MIB, accounted=MIB, baseline=None, residual=0)
    live = GpuProcess(pid=4243, start_time=1.0, user="u", command="x", state="sleeping", vram={1: MIB})
    warn = [SnapshotWarning("ownerless-leak", "GPU 1: ...", 1), SnapshotWarning("no-baseline", "x")]
    residual, warnings = s._gem_holders((fine, leak), (live,), warn)
    assert residual[0] is fine
    (h,) = residual[1].holders  # 4243 is a live process KFD already accounts for: not a holder
    assert (h.pid, h.reason, h.vram_bytes, h.command) == (4242, "gem-buffers", 3 * MIB, "python3")
    assert "amdgpu_gem_info" in h.detail and [w.code for w in warnings] == ["no-baseline"]


def test_history_keeps_fragmentation_and_reads_old_trend_lines(tmp_path):
    import time as _time

    from gpuwarden.ops.agent.history import History
    from gpuwarden.ops.foundation.model import GpuInfo, NodeSnapshot, Residual
    h = History(tmp_path, interval_s=1.0)
    t0 = (_time.time() // 60) * 60 - 120
    for k in range(3):  # two minutes closed: persisted with the fifth value
        for j in range(2):
            snap = NodeSnapshot(taken_at=t0 + 60 * k + j, hostname="n", backend="sim", simulated=True,
                                gpus=(GpuInfo(0, "g", "sim", vram_total=8 * MIB, vram_used=MIB),),
                                processes=(), residual=(Residual(0, MIB, MIB, None, 0),),
                                driver={"vram_free": [{"gpu": 0, "fragmentation": 0.25 + 0.5 * j}]})
            h.add(snap)
    fine = h.series(0, resolution="fine")["fine"]
    assert fine["fragmentation_permille"][:2] == [250, 750]
    h.close()
    old = (tmp_path / "trend.jsonl")
    lines = old.read_text().splitlines()
    assert json.loads(lines[0])["gpus"]["0"][4] == 750
    old.write_text(lines[0].replace(",750]", "]") + "\n" + "\n".join(lines[1:]) + "\n")  # a line from before
    again = History(tmp_path, interval_s=1.0, writable=False)
    minute = again.series(0, since=0, resolution="minute")["minute"]
    assert minute["fragmentation_permille_max"][:2] == [None, 750]


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
