"""Who maps an arena: two real canaries map the same pages and `arena inspect` shows both, with Rss/Pss and registration.

Also the snapshot's list_arenas (config arena + arenas engines map), read from the live /proc.
"""

from __future__ import annotations

import json
import signal

from gpuwarden.ops.foundation.settings import Settings
from helpers.canary import make_arena, spawn, wait_phase

MiB = 1 << 20


def test_two_canaries_share_the_pages_and_inspect_shows_both(cli, tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena", 8 * MiB)
    s1, s2 = tmp_path / "1.status", tmp_path / "2.status"
    p1 = spawn(arena, s1, state_dir, "--runtime", "host", "--gpu", "0")
    p2 = spawn(arena, s2, state_dir, "--runtime", "sim", "--gpu", "1")
    try:
        wait_phase(s1, "serving", p1)
        wait_phase(s2, "serving", p2)
        proc = cli("arena", "inspect", str(arena), "--json")
        assert proc.returncode == 0, proc.stderr
        info = json.loads(proc.stdout)
        by_pid = {m["pid"]: m for m in info["mappers"]}
        assert set(by_pid) == {p1.pid, p2.pid}
        for pid, gpu in ((p1.pid, 0), (p2.pid, 1)):
            m = by_pid[pid]
            assert m["registered"] is True and m["gpu"] == gpu and "gpuwarden.ops.canary" in m["command"]
            # Both copied the whole payload, so all of it is resident in each; the pages are the same
            # ones, so each process's proportional share is about half.
            assert m["rss_bytes"] >= 8 * MiB
            assert 3 * MiB < m["pss_bytes"] < 6 * MiB, m
        text = cli("arena", "inspect", str(arena)).stdout
        assert "mapped by 2 process(es)" in text and str(p1.pid) in text and str(p2.pid) in text
        p2.send_signal(signal.SIGTERM)
        assert p2.wait(20) == 0
        info = json.loads(cli("arena", "inspect", str(arena), "--json").stdout)
        assert [m["pid"] for m in info["mappers"]] == [p1.pid]
        assert info["mappers"][0]["pss_bytes"] >= 8 * MiB - 4096
    finally:
        p1.kill()
        p2.kill()


def test_mapper_without_status_file_is_unknown(tmp_path):
    import subprocess
    import sys
    from gpuwarden.ops.arena.mappers import find_mappers
    arena = make_arena(tmp_path / "a.arena", 2 * MiB)
    code = ("import mmap,sys,time; f=open(sys.argv[1],'rb'); m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ); "
            "m[:]; print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(arena)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        (m,) = find_mappers(arena)
        link = tmp_path / "link.arena"
        link.symlink_to(arena)
        assert [x.pid for x in find_mappers(link)] == [proc.pid]
        assert m.pid == proc.pid and m.registered is None and m.gpu is None and m.rss_bytes >= 2 * MiB
        assert find_mappers(arena, with_usage=False)[0].rss_bytes is None
    finally:
        proc.kill()
        proc.wait()


def test_list_arenas_reads_the_node_config(tmp_path, state_dir):
    import pytest
    pytest.importorskip("gpuwarden.ops.config.nodeconfig")
    from gpuwarden.ops.arena.watch import list_arenas
    arena = make_arena(tmp_path / "a.arena", 2 * MiB)
    config = tmp_path / "node.toml"
    config.write_text(f'[arena]\npath = "{arena}"\n')
    settings = Settings(state_dir=state_dir, config_path=config)
    (info,) = list_arenas(settings)
    assert info.path == str(arena) and info.size == 2 * MiB and info.header_state == "ok" and info.mappers == ()
    arena.write_bytes(b"garbage!" + arena.read_bytes()[8:])
    assert list_arenas(settings)[0].header_state == "bad-magic"
    assert list_arenas(Settings(state_dir=state_dir, config_path=tmp_path / "none.toml")) == []


def test_sim_registration_counts_without_a_status_file(cli, tmp_path, state_dir):
    import os
    import subprocess
    import sys
    from helpers.paths import REPO
    arena = make_arena(tmp_path / "a.arena", 2 * MiB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_STATUS")}
    env["GPUWARDEN_STATE_DIR"] = str(state_dir)
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.ops.canary", "--arena", str(arena), "--runtime", "sim",
                             "--gpu", "2"], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if "session is up" in line:
                break
        (m,) = json.loads(cli("arena", "inspect", str(arena), "--json").stdout)["mappers"]
        assert m["pid"] == proc.pid and m["registered"] is True and m["gpu"] == 2
    finally:
        proc.kill()
        proc.wait()


def test_list_arenas_rescans_proc_only_now_and_then(tmp_path, state_dir, monkeypatch):
    import subprocess
    import sys
    import pytest
    pytest.importorskip("gpuwarden.ops.config.nodeconfig")
    from gpuwarden.ops.arena import watch
    arena = make_arena(tmp_path / "a.arena", 1 * MiB)
    config = tmp_path / "node.toml"
    config.write_text(f'[arena]\npath = "{arena}"\n')
    settings = Settings(state_dir=state_dir, config_path=config)
    code = ("import mmap,sys,time; f=open(sys.argv[1],'rb'); m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ); "
            "print('up', flush=True); time.sleep(60)")

    def mapper():
        p = subprocess.Popen([sys.executable, "-c", code, str(arena)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "up"
        return p
    # The sampler's watch: full scans an hour apart, quick re-reads every time (this test is about the full scan).
    arena_watch = watch.ArenaWatch(settings, full_scan_s=3600.0, quick_s=0.0)
    first = mapper()
    second = None
    try:
        assert [m.pid for m in watch.list_arenas(settings, watch=arena_watch)[0].mappers] == [first.pid]
        second = mapper()
        # Within the interval only known mappers are re-read: the newcomer waits for the next full scan.
        assert [m.pid for m in watch.list_arenas(settings, watch=arena_watch)[0].mappers] == [first.pid]
        arena_watch.full_scan_s = 0.0
        assert sorted(m.pid for m in watch.list_arenas(settings, watch=arena_watch)[0].mappers) == \
            sorted([first.pid, second.pid])
    finally:
        for p in (first, second):
            if p:
                p.kill()
                p.wait()


def test_inspect_shows_the_node_gpu_behind_visible_devices(cli, tmp_path, state_dir):
    arena = make_arena(tmp_path / "a.arena", 1 * MiB)
    status = tmp_path / "s.status"
    proc = spawn(arena, status, state_dir, "--runtime", "host", "--gpu", "0", env={"CUDA_VISIBLE_DEVICES": "3"})
    try:
        wait_phase(status, "serving", proc)
        (m,) = json.loads(cli("arena", "inspect", str(arena), "--json").stdout)["mappers"]
        assert m["gpu"] == 3 and m["registered"] is True
    finally:
        proc.kill()
        proc.wait()
