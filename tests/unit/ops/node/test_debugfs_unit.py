"""The unit half of tests/integration/ops/node/test_debugfs.py (its tests that need no process, socket or server); the pair's subject:
The debugfs reader and parsers (ops/node/debugfs): only allow-listed files are ever opened, trigger files never
(proved with inotify over the sim node's debugfs tree while status, bundle, doctor, arena budget and the agent
run), links/FIFOs/oversized/slow files are refused within their bounds, and each file parses from the kernel's
own print format.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from gpuwarden.ops.node.debugfs import allowlist, parse
from gpuwarden.ops.foundation.deadline import Lanes
from gpuwarden.ops.node.debugfs.reader import DebugfsReader
from helpers.files import tree

MIB = 1 << 20


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


def test_mem_limit_ignores_what_it_does_not_know():
    assert parse.mem_limit(b"System mem used -3M out of 100M\nextra line\n").system_used == 0
    assert parse.mem_limit(b"garbage\n") is None


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
