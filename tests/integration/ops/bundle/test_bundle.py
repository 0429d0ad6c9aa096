"""Incident bundles end to end: hung collectors, checksums, redaction, non-root, full disk, replay.

Real processes throughout: stand-in vendor tools are shell scripts on PATH, secrets live in a real
child's environment, the non-root run switches to nobody with setpriv, the full disk is a tmpfs.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers.paths import REPO
from gpuwarden.ops.bundle import auto
from gpuwarden.ops.bundle.collect import GRACE_S, collect_bundle
from gpuwarden.ops.bundle.collectors import Collector
from gpuwarden.ops.bundle.entries import Entry
from gpuwarden.ops.bundle.replay import snapshot_from_bundle
from gpuwarden.ops.node.sim.node import SimNode


def stub(bindir: Path, name: str, body: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


# The sim node these tests run on (conftest.py's sim_settings fixture reads it).
SIM_NODE = {"gpus": 2, "vram": "8GiB"}


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


def members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return {m.name.split("/", 1)[1]: m for m in tf.getmembers()}


def read(path: Path, rel: str) -> bytes:
    with tarfile.open(path) as tf:
        top = tf.getnames()[0].split("/")[0]
        return tf.extractfile(f"{top}/{rel}").read()


def manifest_of(path: Path) -> dict:
    return json.loads(read(path, "manifest.json"))


def collector(m: dict, name: str) -> dict:
    return next(c for c in m["collectors"] if c["name"] == name)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_hung_rocm_smi_is_killed_with_its_children_and_marked(sim_settings, bindir, tmp_path):
    pids = tmp_path / "pids"
    # The stand-in forks a grandchild that keeps stdout open: only a process-group kill ends it.
    stub(bindir, "rocm-smi", f'echo $$ >> {pids}; sleep 60 & echo $! >> {pids}; wait')
    t0 = time.monotonic()
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=1.5)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.5 + 1.0, f"bundle took {elapsed:.2f}s"
    m = result.manifest
    for name in ("rocm-smi-allinfo", "rocm-smi-pids"):
        c = collector(m, name)
        assert c["status"] == "timed-out" and c["timed_out"] is True, c
    item = next(i for i in m["items"] if i["source"] == "rocm-smi --showpids")
    assert item["timed_out"] and "process group killed" in item["error"]
    assert collector(m, "snapshot")["status"] == "ok"  # the rest of the bundle is unaffected
    hung = [f for f in result.report.findings if f.rule == "bundle.collector_timeout"]
    assert {f.signature for f in hung} == {"rocm-smi-allinfo", "rocm-smi-pids"}
    assert "rocm-smi-allinfo did not answer within the bundle's timeout" in read(result.path, "triage.md").decode()
    deadline = time.monotonic() + 2
    procs = [int(x) for x in pids.read_text().split()]
    assert len(procs) == 4
    while not all(gone(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(gone(p) for p in procs), "a stand-in or its sleep survived the timeout"


def test_cli_bundle_json_reports_timeout(cli, sim_settings, bindir, tmp_path):
    stub(bindir, "nvidia-smi", "sleep 30")
    proc = cli("--backend", "sim", "bundle", "--output", str(tmp_path), "--timeout", "1", "--json",
               env={"PATH": os.environ["PATH"]}, timeout=30)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert next(c for c in data["collectors"] if c["name"] == "nvidia-smi")["status"] == "timed-out"
    assert data["duration_s"] < 1 + 4.0  # the stand-in sleeps 30 s: the 1 s timeout ended it (slack: a busy box)
    assert Path(data["path"]).is_file()
    proc = cli("triage", data["path"], "--json")
    assert proc.returncode == 1  # a hung vendor tool is an error-level finding
    assert any(f["rule"] == "bundle.collector_timeout" and f["signature"] == "nvidia-smi"
               for f in json.loads(proc.stdout)["findings"])


def test_every_sha256_matches_and_the_archive_is_private(sim_settings, tmp_path):
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5)
    assert stat.S_IMODE(result.path.stat().st_mode) == 0o600
    m = manifest_of(result.path)
    names = members(result.path)
    files = [i for i in m["items"] if i["kind"] not in ("dir", "link")]
    assert len(files) > 20
    for item in files:
        data = read(result.path, item["path"])
        assert len(data) == item["bytes"], item["path"]
        assert hashlib.sha256(data).hexdigest() == item["sha256"], item["path"]
    # everything in the archive is in the manifest (and nothing else is there)
    listed = {i["path"] for i in m["items"]} | {"manifest.json"}
    assert {n for n, ti in names.items() if not ti.isdir()} <= listed
    for must in ("kernel/kernel.log", "gpuwarden/snapshot.json", "triage.md", "triage.json",
                 "tree/sys/class/drm/card0/device/mem_info_vram_used", "tree/proc/meminfo", "tree/proc/cmdline",
                 "node/versions.json", "node/node.json"):
        assert must in listed, must
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")], "temp file left behind"


def test_planted_secrets_appear_nowhere(sim_settings, tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "kfd").write_text("")
    secrets = {"HF_TOKEN": "hf_" + "Q7" * 17, "MY_SERVICE_PASSWORD": "Zebra-4471-pw",
               "DB_URL": "postgres://svc:Hunter2Secret@db:5432/x", "OPENAI_API_KEY": "sk-" + "R9" * 20,
               "DB_PWD": "Pwd-Planted-771", "MY_PASS": "Pass-Planted-882",
               "AZURE_STORAGE": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=AzKey/Planted+993==;"
                                "EndpointSuffix=core.windows.net",
               "NCCL_DEBUG": "WARN", "HIP_VISIBLE_DEVICES": "0", "HIP_API_TOKEN": "Hip-Token-Planted-1"}
    argv_secrets = ["--api-key=sk-proj-" + "S3" * 15, "--password", "Tr0ub4dor-3-horse",
                    "-u", "curluser:Curl-Pass-Planted-4", "https://bob:Url-Pass-Planted-5@host/x"]
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); print('ready', flush=True); time.sleep(60)",
         str(dev / "kfd"), *argv_secrets],
        env={**os.environ, **secrets}, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        engine = sim_settings.state_dir / "engines" / "e0"
        engine.mkdir(parents=True)
        (engine / "state.json").write_text(json.dumps({"name": "e0", "pid": child.pid, "phase": "serving"}))
        (engine / "engine.log").write_text(f"loading with token {secrets['HF_TOKEN']}\nsession is up\n")
        result = collect_bundle(sim_settings.with_(dev_root=dev), output=tmp_path, timeout_s=5)
    finally:
        child.kill()
        child.wait()
    raw = gzip.decompress(result.path.read_bytes())
    planted = [v for k, v in secrets.items() if k not in ("NCCL_DEBUG", "HIP_VISIBLE_DEVICES")]
    for value in [*planted, "Hunter2Secret", "S3" * 15, "Tr0ub4dor-3-horse", "AzKey/Planted+993==",
                  "Curl-Pass-Planted-4", "Url-Pass-Planted-5"]:
        assert value.encode() not in raw, f"secret {value[:6]}... leaked"
    environ = read(result.path, f"tree/proc/{child.pid}/environ")
    # An allow-list: GPU visibility, tuning and PATH-like variables stay; everything else is dropped...
    assert b"PATH=" in environ and b"NCCL_DEBUG=WARN" in environ and b"HIP_VISIBLE_DEVICES=0" in environ
    for name in ("HF_TOKEN", "MY_SERVICE_PASSWORD", "DB_URL", "DB_PWD", "MY_PASS", "AZURE_STORAGE"):
        assert name.encode() + b"=" not in environ, name
    # ...and an allowed variable whose name says secret keeps its name, not its value.
    assert b"HIP_API_TOKEN=[REDACTED:env-secret-name]" in environ
    cmdline = read(result.path, f"tree/proc/{child.pid}/cmdline").split(b"\0")
    assert b"curluser:[REDACTED:option-credentials]" in cmdline and b"[REDACTED:secret-option]" in cmdline
    pids = json.loads(read(result.path, "gpuwarden/pids.json"))
    assert child.pid in pids["gpu_holders"]
    red = result.manifest["redaction"]
    assert red["by_pattern"]["env-secret-name"] >= 1 and red["by_pattern"]["env-not-allow-listed"] >= 6
    assert any(i["path"] == f"tree/proc/{child.pid}/cmdline" for i in red["by_item"])
    assert any(i["path"] == "engines/e0/engine.log" for i in red["by_item"])
    assert "Q7Q7" not in json.dumps(result.manifest)


def test_collector_failures_and_hangs_never_stop_the_bundle(sim_settings, tmp_path):
    def boom(ctx):
        raise RuntimeError("driver said no")

    def stuck(ctx):
        time.sleep(30)
        return []

    def fine(ctx):
        return [Entry("fine", "here", "generated", path="fine.txt", data=b"ok\n")]

    t0 = time.monotonic()
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=0.5,
                            collectors=(Collector("boom", boom), Collector("stuck", stuck), Collector("fine", fine)))
    assert time.monotonic() - t0 < 0.5 + GRACE_S + 0.5
    m = result.manifest
    assert collector(m, "boom") == {"name": "boom", "status": "failed", "duration_s": collector(m, "boom")["duration_s"],
                                    "timed_out": False, "error": "RuntimeError: driver said no"}
    assert collector(m, "stuck")["status"] == "timed-out"
    assert read(result.path, "fine.txt") == b"ok\n"
    assert "no kernel log" in read(result.path, "triage.md").decode()


def test_kernel_log_since_window_and_tail_cap(sim_settings, bindir, tmp_path):
    now = time.time()

    def iso(t):
        return time.strftime("%Y-%m-%dT%H:%M:%S,000000+00:00", time.gmtime(t))
    lines = [f"{iso(now - 7200)} old line {i}" for i in range(3)] + [f"{iso(now - 60)} recent line {i}" for i in range(3)]
    log = tmp_path / "log.txt"
    log.write_text("\n".join(lines) + "\n")
    stub(bindir, "dmesg", f"cat {log}")
    result = collect_bundle(sim_settings, output=tmp_path, since="30m", timeout_s=5)
    text = read(result.path, "kernel/kernel.log").decode()
    assert "old line" not in text and text.count("recent line") == 3

    big = tmp_path / "big.txt"
    big.write_text("".join(f"[{i:6d}.000000] filler line {i}\n" for i in range(5000)) + "[99999.0] MARKER-END\n")
    stub(bindir, "dmesg", f"cat {big}")
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5, max_bytes=4096)
    data = read(result.path, "kernel/kernel.log")
    assert len(data) == 4096 and data.endswith(b"MARKER-END\n")
    item = next(i for i in result.manifest["items"] if i["path"] == "kernel/kernel.log")
    assert item["truncated"] and item["original_bytes"] == big.stat().st_size


def test_kmsg_fallback_when_dmesg_and_journalctl_are_refused(sim_settings, bindir, tmp_path):
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    for tool in ("dmesg", "journalctl"):
        stub(bindir, tool, f'echo "{tool}: read kernel buffer failed: Operation not permitted" >&2; exit 1')
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5)
    item = next(i for i in result.manifest["items"] if i["path"] == "kernel/kernel.log")
    assert item["source"] == "/dev/kmsg" and item["bytes"] > 0
    refused = {e["source"].split()[0]: e for e in result.manifest["not_collected"] if e["collector"] == "kernel-log"}
    assert refused["dmesg"]["status"] == "permission-denied" and refused["journalctl"]["status"] == "permission-denied"


def test_triage_inside_bundle_and_cli(cli, sim_settings, bindir, tmp_path, fixtures):
    stub(bindir, "dmesg", f"cat {fixtures / 'dmesg/rocm4189_rx570_segfault_libamdhip64.log'}")
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5)
    tri = json.loads(read(result.path, "triage.json"))
    assert {f["rule"] for f in tri["findings"]} >= {"userspace.crash"}
    assert "libamdhip64" in read(result.path, "triage.md").decode()
    proc = cli("triage", str(result.path), "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["findings"][0]["rule"] == "userspace.crash"


def test_replay_reads_the_captured_tree(cli, sim_settings, tmp_path):
    holder = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(sim_settings.state_dir), "sim", "hold",
                               "--gpu", "1", "--size", "3GiB"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert "holding" in holder.stdout.readline()
        from gpuwarden.ops.node import nodestate
        from gpuwarden.ops.sampling.sampler import take_snapshot
        nodestate.set_baseline(sim_settings.state_dir, {0: 1 << 20, 1: 2 << 20}, backend="sim")
        live = take_snapshot(sim_settings)
        result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5)
        nodestate.set_baseline(sim_settings.state_dir, {0: 0, 1: 0}, backend="sim")  # changed after the bundle
    finally:
        holder.terminate()
        holder.wait(10)
    snap = snapshot_from_bundle(result.path, sim_settings.with_(backend=None))
    assert snap.source == f"bundle:{result.path}"
    assert [(g.index, g.vram_total, g.vram_used) for g in snap.gpus] ==\
           [(g.index, g.vram_total, g.vram_used) for g in live.gpus]
    assert snap.gpus[1].vram_used == 3 << 30
    assert [r.baseline for r in snap.residual] == [1 << 20, 2 << 20]  # the baseline recorded in the bundle
    replayed = {p.pid: p for p in snap.processes}
    assert replayed[holder.pid].vram == {1: 3 << 30} and replayed[holder.pid].device_files
    proc = cli("status", "--bundle", str(result.path), "--json")
    assert json.loads(proc.stdout)["source"] == f"bundle:{result.path}", proc.stderr


def test_auto_bundles_are_rate_limited_across_threads(sim_settings):
    paths: list[str | None] = []
    threads = [threading.Thread(target=lambda: paths.append(auto.maybe_collect(sim_settings, "e0", "killed by SIGSEGV")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    made = [p for p in paths if p]
    assert len(made) == 1 and Path(made[0]).is_file()
    assert made[0].startswith(str(sim_settings.state_dir / "bundles"))
    m = manifest_of(Path(made[0]))
    assert m["options"]["safe_mode"] is True and collector(m, "rocm-smi-pids")["status"] == "skipped"
    from gpuwarden.ops.foundation import journal
    entries = [e for e in journal.read(sim_settings.state_dir) if e["action"] == "bundle.auto"]
    assert sorted(e["result"] for e in entries) == ["ok", "skipped", "skipped"]
    assert next(e for e in entries if e["result"] == "ok")["path"] == made[0]


def _nobody_can_run() -> str | None:
    if os.geteuid() != 0:
        return "tests do not run as root: cannot switch to nobody"
    if not shutil.which("setpriv"):
        return "setpriv is not installed"
    return None


def as_nobody(base: Path, *args: str) -> subprocess.CompletedProcess:
    """The real CLI as uid/gid 65534 (nobody), with a state dir under `base`."""
    cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-m",
           "gpuwarden.playbooks.cli.root", "--state-dir", str(base / "state"), "--backend", "sim", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(base)})


@pytest.fixture
def nobody_base():
    """A directory nobody can write into (not under pytest's root-only tmp dirs); skips where setpriv can't run."""
    why = _nobody_can_run()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="gw-nobody-"))
    os.chmod(base, 0o777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_non_root_collection_says_what_it_could_not_read(nobody_base):
    base = nobody_base
    proc = as_nobody(base, "bundle", "--output", str(base), "--timeout", "5")
    assert proc.returncode == 0, proc.stderr
    assert "not root" in proc.stdout and "could not read" in proc.stdout
    path = next(base.glob("*.tar.gz"))
    assert path.stat().st_uid == 65534 and stat.S_IMODE(path.stat().st_mode) == 0o600
    m = manifest_of(path)
    assert m["collected_by"]["root"] is False and m["collected_by"]["uid"] == 65534
    denied = [e for e in m["not_collected"] if e["status"] == "permission-denied"]
    assert any("open files" in (e.get("error") or "") for e in denied)
    assert collector(m, "snapshot")["status"] == "ok"


def _fill_stub(bindir: Path) -> None:
    # ~400 KB of base64 noise: compresses poorly, so the archive outgrows the 64 KiB target
    stub(bindir, "dmesg", "head -c 300000 /dev/urandom | base64")


def test_full_disk_leaves_no_partial_archive(cli, sim_settings, bindir, tmp_path):
    target = tmp_path / "small"
    target.mkdir()
    mounted = False
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)],
                                 capture_output=True).returncode == 0
    _fill_stub(bindir)
    try:
        if mounted:
            proc = cli("--backend", "sim", "bundle", "--output", str(target), env={"PATH": os.environ["PATH"]})
        else:
            # No tmpfs: a child whose file-size limit stands in for the full disk (EFBIG instead of ENOSPC).
            def limit():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
            proc = subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(sim_settings.state_dir),
                                   "--backend", "sim", "bundle", "--output", str(target)], cwd=REPO,
                                  capture_output=True, text=True, preexec_fn=limit, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "no space left" in proc.stderr and "nothing was left behind" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert os.listdir(target) == []
    finally:
        if mounted:
            subprocess.run(["umount", str(target)], check=False)


def test_triage_reports_residual_vram_and_its_holders(sim_settings, tmp_path):
    holder = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(sim_settings.state_dir), "sim", "hold",
                               "--gpu", "0", "--size", "2GiB"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert "holding" in holder.stdout.readline()
        holder.kill()  # not reaped yet: a zombie that still holds its simulated VRAM
        deadline = time.monotonic() + 5
        while not gone(holder.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        SimNode(sim_settings.state_dir).leak(1, 4 << 30)
        result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5)
    finally:
        holder.wait(10)
    found = {f.signature: f for f in result.report.findings if f.rule == "snapshot.residual_vram"}
    assert set(found) == {"0", "1"}
    assert found["0"].victims[0]["pid"] == holder.pid and found["0"].victims[0]["reason"] == "zombie"
    assert found["1"].severity == "error" and "4.0 GiB residual VRAM, held by no live holder" in found["1"].title
    md = read(result.path, "triage.md").decode()
    assert "GPU 1: 4.0 GiB residual VRAM" in md


def test_bundle_playbook_is_what_cli_and_tui_run(cli, sim_settings, tmp_path):
    from gpuwarden.ops.foundation import journal
    from gpuwarden.playbooks.bundle import BundlePlaybook
    from gpuwarden.playbooks.framework import run
    # The command builds this very playbook (imported where it runs, to keep the CLI's start-up light).
    assert "from gpuwarden.playbooks.bundle import BundlePlaybook" in (REPO / "playbooks/cli/commands/bundle.py").read_text()
    events = []
    res = run(BundlePlaybook(output=tmp_path, timeout_s=5), sim_settings, sink=events.append)
    assert res.ok and Path(res.data["bundle"]).is_file()
    from gpuwarden.ops.bundle.collectors import COLLECTORS
    assert sum(1 for e in events if e.kind == "info" and e.message.startswith("collected ")) == len(COLLECTORS)
    assert [e["result"] for e in journal.read(sim_settings.state_dir) if e["action"] == "bundle"] == ["started", "ok"]
    proc = cli("--backend", "sim", "bundle", "--dry-run")
    assert proc.returncode == 0 and "nothing changed" in proc.stdout
    assert not (sim_settings.state_dir / "bundles").exists() or not list((sim_settings.state_dir / "bundles").glob("*.tar.gz"))


def test_progress_shows_on_a_terminal_only(sim_settings, tmp_path):
    import pty
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(sim_settings.state_dir), "--backend",
                                 "sim", "bundle", "--output", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=slave, stdin=subprocess.DEVNULL, text=True)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 0
    from gpuwarden.ops.bundle.collectors import COLLECTORS
    n = len(COLLECTORS)
    assert f"collecting {n}/{n}: {COLLECTORS[-1].name}".encode() in seen and b"\x1b[2K" in seen
    assert "collecting" not in out  # stdout stays clean for scripts


def test_unwritable_output_fails_before_collecting(nobody_base):
    base = nobody_base
    proc = as_nobody(base, "bundle", "--output", str(base / "no-such-dir" / "b.tar.gz"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    ro = base / "ro"
    ro.mkdir(mode=0o755)  # owned by root: nobody cannot write there
    proc = as_nobody(base, "bundle", "--output", str(ro))
    assert proc.returncode == 2 and "permission denied" in proc.stderr and "Traceback" not in proc.stderr


def test_plain_dmesg_when_time_format_is_unknown(sim_settings, bindir, tmp_path, fixtures):
    log = fixtures / "dmesg/rocm343_comment3_kfd_evicting_pasid_sdma_oversubscription.log"
    stub(bindir, "dmesg", f'[ $# -gt 0 ] && {{ echo "dmesg: unrecognized option: time-format" >&2; exit 1; }}; cat {log}')
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5)
    item = next(i for i in result.manifest["items"] if i["path"] == "kernel/kernel.log")
    assert item["source"] == "dmesg" and read(result.path, "kernel/kernel.log") == log.read_bytes()
    first = next(e for e in result.manifest["not_collected"] if e["collector"] == "kernel-log")
    assert first["status"] == "failed" and "unrecognized option" in first["error"]


def test_a_tool_printing_a_secret_in_its_error_is_redacted(sim_settings, bindir, tmp_path):
    stub(bindir, "amd-smi", 'echo "cannot reach https://svc:S3cretPassw0rd@telemetry.example/x" >&2; exit 3')
    result = collect_bundle(sim_settings, output=tmp_path, timeout_s=5)
    raw = gzip.decompress(result.path.read_bytes())
    assert b"S3cretPassw0rd" not in raw
    c = collector(result.manifest, "amd-smi-static")
    assert c["status"] == "failed" and "[REDACTED:url-credentials]" in c["error"]


def test_auto_bundles_are_named_and_only_they_are_pruned(sim_settings, tmp_path):
    bundles = sim_settings.state_dir / "bundles"
    bundles.mkdir(parents=True, exist_ok=True)
    manual = bundles / "gpuwarden-bundle-host-20260101-000000.tar.gz"
    manual.write_bytes(b"x")
    for i in range(3):
        old = bundles / f"gpuwarden-bundle-host-auto-2026010{i}-000000-e0.tar.gz"
        old.write_bytes(b"x")
        os.utime(old, (1_700_000_000 + i, 1_700_000_000 + i))
    path = auto.maybe_collect(sim_settings, "e/0 bad", "killed by SIGSEGV", min_interval_s=0)
    assert path and "-auto-" in path and path.endswith("-e_0_bad.tar.gz")
    auto._prune(sim_settings, keep=2)
    left = sorted(p.name for p in bundles.glob("*.tar.gz"))
    assert manual.name in left and Path(path).name in left
    assert left.count(manual.name) == 1 and len([n for n in left if "-auto-" in n]) == 2
