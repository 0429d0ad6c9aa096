"""Hostile input, round 3 (issue 39): each item's regression, run through the real CLI (and real sockets,
files and processes) where the item is about what a user sees.

Items: 1-2 arena options, 3 one bundle reader, 4 pipelining clients, 5 secrets, 6 GPU indexes and option
values, 7 the fleet's SSH config.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.bundles import real_bundle  # noqa: F401  (a fixture: the tests below take it by name)


def refused(proc: subprocess.CompletedProcess, needle: str) -> None:
    """Exit 2, one error line naming what was wrong, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Error:" not in proc.stderr.replace("error:", ""), proc.stderr
    assert needle in proc.stderr, proc.stderr


# --- items 1 and 2: arena create's chunk size and workers ----------------------------------------------

@pytest.mark.parametrize("chunk", ["99999PiB", "9999999999999999999999TiB", "2TiB"])
def test_an_absurd_chunk_size_is_refused_not_a_traceback(cli, tmp_path, chunk):
    proc = cli("arena", "create", str(tmp_path / "a.arena"), "--size", "1MiB", "--chunk-size", chunk)
    refused(proc, "chunk size")
    assert not list(tmp_path.glob("*a.arena*"))


def _peak_rss_kib(argv: list[str]) -> tuple[int, int]:
    """Run argv to its end; (exit status, the child's peak RSS in KiB) from wait4 on that one child."""
    child = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_maxrss


def test_a_chunk_larger_than_the_arena_costs_no_memory(state_dir, tmp_path):
    # Before the fix: a 256 MiB template plus a 256 MiB buffer for a 1 MiB arena (over 500 MB peak).
    arena = tmp_path / "a.arena"
    code, rss = _peak_rss_kib([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir),
                               "arena", "create", str(arena), "--size", "1MiB", "--chunk-size", "256MiB", "-q"])
    assert code == 0
    assert rss < 150 * 1024, f"peak RSS {rss} KiB for a 1 MiB arena"
    from gpuwarden.ops.arena.verify import verify
    done = verify(arena)
    assert done.header.chunk_size == 1 << 20 and done.header.chunk_count == 1


def test_big_chunks_on_many_workers_stay_within_the_budget(state_dir, tmp_path):
    # 4 chunks of 16 MiB on 4 workers: before, one 16 MiB template and four 16 MiB buffers (80 MiB) more than a
    # create of 1 MiB chunks on one worker. Compared with that run on the same arena size, so the arena's own
    # mapped file pages (counted in RSS, more or fewer as writeback goes on a busy machine) cancel out.
    def peak(name: str, chunk: str, workers: str) -> int:
        code, rss = _peak_rss_kib([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir),
                                   "arena", "create", str(tmp_path / name), "--size", "64MiB", "--chunk-size", chunk,
                                   "--workers", workers, "-q"])
        assert code == 0
        return rss
    small = peak("small.arena", "1MiB", "1")
    big = peak("a.arena", "16MiB", "4")
    assert big - small < 24 * 1024, (big, small)
    from gpuwarden.ops.arena.verify import verify
    assert verify(tmp_path / "a.arena", workers=2).header.chunk_count == 4


@pytest.mark.parametrize("workers", ["0", "-1", "100000"])
def test_workers_out_of_range_are_refused(cli, tmp_path, workers):
    refused(cli("arena", "create", str(tmp_path / "a.arena"), "--size", "1MiB", "--workers", workers), "--workers")
    assert not list(tmp_path.glob("*a.arena*"))


def test_verify_workers_and_an_empty_size_are_refused(cli, tmp_path):
    arena = tmp_path / "a.arena"
    assert cli("arena", "create", str(arena), "--size", "1MiB", "-q").returncode == 0
    refused(cli("arena", "verify", str(arena), "--workers", "0"), "--workers")
    refused(cli("arena", "verify", str(arena), "--size", ""), "cannot read size ''")


# --- item 3: one reader for every command that opens a bundle -------------------------------------------

BUNDLE_COMMANDS = [("status", "--bundle"), ("report",), ("report", "--json"), ("triage",), ("triage", "--json"),
                   ("doctor", "--bundle"), ("doctor", "--json", "--bundle")]


def _members(raw: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]


def _pack(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _with_manifest(raw: bytes, change) -> bytes:
    out = []
    for info, data in _members(raw):
        if info.name.endswith("/manifest.json") and info.name.count("/") == 1:
            data = change(json.loads(data))
            data = data if isinstance(data, bytes) else json.dumps(data).encode()
        out.append((info, data))
    return _pack(out)


def _with_member(raw: bytes, name: str, kind: bytes, link: str = "") -> bytes:
    members = _members(raw)
    top = members[0][0].name.split("/")[0]
    info = tarfile.TarInfo(name.replace("TOP", top))
    info.type, info.linkname = kind, link
    return _pack([*members, (info, b"x" if kind == tarfile.REGTYPE else None)])


def _bad_crc(raw: bytes) -> bytes:
    body = bytearray(raw)
    body[-8] ^= 0xFF  # the gzip trailer's CRC32: every byte of the archive itself is intact
    return bytes(body)


HOSTILE_BUNDLES = {
    "tree-is-a-list": lambda raw: _with_manifest(raw, lambda m: {**m, "tree": [1]}),
    "items-not-a-list": lambda raw: _with_manifest(raw, lambda m: {**m, "items": {"a": 1}}),
    "collectors-of-strings": lambda raw: _with_manifest(raw, lambda m: {**m, "collectors": ["x"]}),
    "manifest-not-json": lambda raw: _with_manifest(raw, lambda m: b"{not json"),
    "crc-fails": _bad_crc,
    "crc-fails-and-manifest-corrupt": lambda raw: _bad_crc(_with_manifest(raw, lambda m: b"{not json")),
    "traversal": lambda raw: _with_member(raw, "TOP/../../escape", tarfile.REGTYPE),
    "absolute": lambda raw: _with_member(raw, "/etc/cron.d/x", tarfile.REGTYPE),
    "symlink": lambda raw: _with_member(raw, "TOP/tree/sys/class/drm", tarfile.SYMTYPE, "/etc"),
    "hardlink": lambda raw: _with_member(raw, "TOP/tree/sys/x", tarfile.LNKTYPE, "/etc/shadow"),
    "fifo": lambda raw: _with_member(raw, "TOP/tree/sys/fifo", tarfile.FIFOTYPE),
    "second-top": lambda raw: _with_member(raw, "other/manifest.json", tarfile.REGTYPE),
}


@pytest.fixture(scope="module")
def hostile_bundles(real_bundle, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile-bundles")
    out = {}
    for name, make in HOSTILE_BUNDLES.items():
        out[name] = d / f"{name}.tar.gz"
        out[name].write_bytes(make(real_bundle))
    good = d / "good.tar.gz"
    good.write_bytes(real_bundle)
    out["good"] = good
    return out


def run_cli(*args: str) -> tuple[int, str, str]:
    """The real CLI in this process (a subprocess for each of 7 commands x 13 bundles would take minutes)."""
    import contextlib
    from gpuwarden.playbooks.cli import root as cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", sorted(HOSTILE_BUNDLES))
def test_every_bundle_command_refuses_the_same_damaged_bundle(hostile_bundles, state_dir, name):
    path = str(hostile_bundles[name])
    lines = set()
    for words in BUNDLE_COMMANDS:
        code, out, err = run_cli("--state-dir", str(state_dir), *words, path)
        assert code == 2 and "Traceback" not in err, (words, code, out[-2000:], err)
        if "--json" not in words:
            lines.add(err.strip().splitlines()[0])
        else:
            assert json.loads(out)["exit_code"] == 2, out
    assert len(lines) == 1, lines  # one judgement: every command gives the same sentence


def test_a_real_bundle_still_opens_in_every_command(hostile_bundles, state_dir):
    for words in BUNDLE_COMMANDS:
        code, out, err = run_cli("--state-dir", str(state_dir), *words, str(hostile_bundles["good"]))
        assert code in (0, 1), (words, out[-2000:], err)


def test_the_tui_triage_screen_uses_the_same_reader(hostile_bundles):
    from gpuwarden.tui.screens.triage import triage_text
    assert "is a corrupt gzip file" in triage_text(hostile_bundles["crc-fails"])
    assert "symbolic link" in triage_text(hostile_bundles["symlink"])


# --- item 4: clients that do not read their answers -----------------------------------------------------

def _pipeliner(path: Path, count: int) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(str(path))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * count)
        return s
    except OSError:
        s.close()
        return None


def test_a_pipelining_client_gets_one_answer_until_it_reads(cli, state_dir):
    from helpers.agentnode import start_agent
    from helpers.simnode import wait_for

    from gpuwarden.ops.agent.client import get
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    agent = start_agent(state_dir)
    try:
        wait_for(lambda: (r := get(agent.sock, "/healthz")) is not None and r.status == 200, 10, "the first snapshot")
        s = _pipeliner(agent.sock, 50)
        assert s is not None
        with s:
            # The client reads nothing past the write deadline: one answer waited for it, never fifty, and then
            # the connection was dropped (the other 49 requests are never answered).
            got = _read_for(s, 3.0)
            assert got.count(b"HTTP/1.1 200") == 1, got[:400]
    finally:
        agent.stop()


def _read_for(s: socket.socket, seconds: float) -> bytes:
    """Wait `seconds` without reading (the client that does not read), then read what came, until EOF or quiet."""
    import time as _time
    end = _time.monotonic() + seconds
    while _time.monotonic() < end:
        _time.sleep(0.05)
    data = b""
    s.settimeout(2)
    try:
        while chunk := s.recv(65536):  # to EOF: the agent closed the connection
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_a_pipelining_crowd_does_not_starve_healthz(cli, state_dir):
    import threading
    import time as _time

    from helpers.agentnode import start_agent
    from helpers.simnode import wait_for

    from gpuwarden.ops.agent.client import get
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    agent = start_agent(state_dir)
    stop = threading.Event()

    def crowd() -> None:
        socks: list[socket.socket | None] = []
        while not stop.is_set():
            for s in socks:
                if s is not None:
                    s.close()
            socks = [_pipeliner(agent.sock, 50) for _ in range(120)]  # past the agent's 64 slots
            stop.wait(2.5)
        for s in socks:
            if s is not None:
                s.close()

    try:
        wait_for(lambda: (r := get(agent.sock, "/healthz")) is not None and r.status == 200, 10, "the first snapshot")
        thread = threading.Thread(target=crowd, daemon=True)
        thread.start()
        statuses = []
        end = _time.monotonic() + 8
        while _time.monotonic() < end:
            reply = get(agent.sock, "/healthz", timeout=2)
            statuses.append(reply.status if reply is not None else None)
            _time.sleep(0.1)
        stop.set()
        thread.join(30)
        assert statuses and all(st == 200 for st in statuses), statuses
    finally:
        stop.set()
        agent.stop()


def test_the_metrics_listener_answers_garbage_with_a_status_line(cli, state_dir):
    from helpers.agentnode import start_agent
    from helpers.simnode import wait_for
    from helpers.harden_slowloris import metrics_port
    assert cli("sim", "init", "--gpus", "2").returncode == 0
    agent = start_agent(state_dir, agent_args=("--metrics-listen", "127.0.0.1:0"))
    try:
        port = int(wait_for(lambda: metrics_port(agent), 10, "the metrics listener's port"))
        for garbage in (b"GARBAGE\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\r\n\r\n", b"GET\r\n\r\n",
                        b"GET /metrics\r\n\r\n"):  # the last is HTTP/0.9's form, answered without a status line
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(garbage)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            assert data.startswith(b"HTTP/1.0 400 ") or data.startswith(b"HTTP/1.0 501 "), data[:200]
            assert b"<html" not in data.lower(), data[:300]
    finally:
        agent.stop()


# --- item 5: the documented redaction decisions ---------------------------------------------------------

@pytest.mark.parametrize("line, gone, kept", [
    ("redis://:Pw-1@cache:6379", "Pw-1", "redis://:"),
    ("REDIS_URL=redis://:Pw-2@cache:6379/0", "Pw-2", "@cache:6379/0"),
    ("wandb: key 0123456789abcdef0123456789abcdef01234567 saved", "0123456789abcdef", "wandb: key"),
    ("sshpass -p Pw-3 ssh node", "Pw-3", "ssh node"),
    ("app --port -p8080", None, "-p8080"),
    ("mysql -uroot -pPw-4 app", "Pw-4", "-uroot"),
    ("sshpass Pw-5 ssh node", None, "sshpass Pw-5"),  # not sshpass's syntax: Pw-5 is the program it runs
    ("at commit 0123456789abcdef0123456789abcdef01234567", None, "0123456789abcdef"),  # a git id, not a key
])
def test_redaction_rules_as_documented(line, gone, kept):
    from gpuwarden.ops.foundation import redact
    out = redact.text(line)
    assert kept in out, out
    if gone is not None:
        assert gone not in out and "[REDACTED:" in out, out
    else:
        assert out == line
    assert "redis://:" in redact.__doc__ and "-p8080" in redact.__doc__ and "sshpass PW" in redact.__doc__


# --- item 6: GPU indexes, counts and option values taken too kindly -------------------------------------

SIM_NODE = {"gpus": 2, "vram": "8GiB"}
NOT_DIGITS = [" 1", "１", "+1", "1_0", "1 "]


@pytest.mark.parametrize("words", [("fix", "{}", "--yes"), ("drain", "{}", "--yes"), ("undrain", "{}", "--yes"),
                                   ("reset", "{}", "--yes"), ("purge", "{}", "--yes"), ("gpu-check", "{}"),
                                   ("baseline", "record", "{}"), ("sim", "leak", "--gpu", "{}", "--size", "1GiB"),
                                   ("journal", "-n", "{}"), ("history", "{}"), ("engines", "logs", "e0", "-n", "{}")])
def test_a_gpu_index_or_count_in_anything_but_plain_digits_is_refused(sim_state, words):
    for bad in NOT_DIGITS:
        code, out, err = run_cli("--state-dir", str(sim_state), "--backend", "sim",
                                 *(w.replace("{}", bad) for w in words))
        assert code == 2 and "plain digits" in err, (words, bad, code, out, err)
    assert not (sim_state / "drained.json").exists() or "1" not in (sim_state / "drained.json").read_text()


def test_bundle_dry_run_refuses_what_the_real_run_refuses(cli, tmp_path):
    for args in (("--max-bytes", "0"), ("--max-bytes", "1000"), ("--timeout", "0.01", "--since", "yesterday")):
        dry = cli("bundle", "--dry-run", "-o", str(tmp_path) + "/", *args)
        assert dry.returncode == 2 and "Traceback" not in dry.stderr, (args, dry.stdout, dry.stderr)
    assert not list(tmp_path.glob("*.tar.gz"))


# --- item 7: the fleet's SSH config and host count -------------------------------------------------------

def _ssh_config_refused(state_dir: Path, cfg: Path, needle: str) -> None:
    import time as _time
    t0 = _time.monotonic()
    code, out, err = run_cli("--state-dir", str(state_dir), "fleet", "status", "--ssh-config", str(cfg),
                             "--nodelist", "gpu01", "--json")
    assert code == 2 and needle in (out + err) and "Recursion" not in (out + err), (code, out, err)
    assert _time.monotonic() - t0 < 5, "the ssh config was read before it was refused"


def test_a_huge_ssh_config_is_refused_at_once(state_dir, tmp_path):
    cfg = tmp_path / "ssh_config"
    with open(cfg, "wb") as f:
        f.truncate(100 << 20)  # sparse: 100 MB that cost no disk
    _ssh_config_refused(state_dir, cfg, "larger than")


def test_a_fifo_or_a_directory_as_ssh_config_is_named_as_such(state_dir, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _ssh_config_refused(state_dir, fifo, "is a FIFO")
    _ssh_config_refused(state_dir, tmp_path, "is a directory")


def test_an_ssh_config_that_includes_itself_is_one_clean_line(state_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text(f"Host *\n  Include {b}\n")
    b.write_text(f"Include={a}\n")
    _ssh_config_refused(state_dir, a, "includes itself")
    a.write_text(f"Include {a}\n")
    _ssh_config_refused(state_dir, a, "includes itself")


def test_serve_fleet_counts_the_hosts_before_serving(state_dir):
    proc = subprocess.run([sys.executable, "-m", "gpuwarden.tui.main", "--state-dir", str(state_dir), "serve",
                           "--fleet", "--nodelist", "node[1-99999999]", "--listen", "127.0.0.1:1"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)  # a served console never exits
    refused(proc, "99,999,999 hosts")


def test_an_oversized_ansible_inventory_reads_an_not_a(state_dir, tmp_path):
    inv = tmp_path / "inventory.ini"
    with open(inv, "wb") as f:
        f.truncate(64 << 20)
    code, out, err = run_cli("--state-dir", str(state_dir), "fleet", "status", "--hosts-from", str(inv),
                             "--group", "gpu")
    assert code == 2 and "an Ansible inventory" in err and "a Ansible" not in err, err
