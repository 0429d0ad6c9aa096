"""The operator's review: failures an SRE meets on a broken node give one line and the right exit status.

Each test runs the real CLI on real files, directories and processes (a read-only state dir as nobody,
a bundle interrupted with SIGINT while a stand-in vendor tool hangs, a reader that closes the pipe).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.cli import gpuwarden
from helpers.signals import default_signals
from helpers.journal import read_journal


def one_line_error(proc: subprocess.CompletedProcess, needle: str, code: int = 2) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines and lines[0].startswith("gpuwarden: error: ") and needle in lines[0], proc.stderr
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("  hint: ")), proc.stderr


def nobody(*args: str, base: Path) -> subprocess.CompletedProcess:
    cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-m",
           "gpuwarden.playbooks.cli.root", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(base)}, stdin=subprocess.DEVNULL)


@pytest.fixture
def shared_base():
    """A directory nobody can reach (pytest's tmp_path is private to root)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as nobody")
    base = Path(tempfile.mkdtemp(prefix="gw-review-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


# --- the state dir -----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("status",), ("sim", "init")])
def test_state_dir_under_proc_is_one_line(args):
    proc = gpuwarden("--state-dir", "/proc/gpuwarden-review", "--backend", "sim", *args, env={})
    one_line_error(proc, "cannot create the state dir /proc/gpuwarden-review")


def test_read_only_state_dir_as_nobody_is_one_line(shared_base):
    state = shared_base / "state"
    state.mkdir(mode=0o755)  # root's, and nobody may not write in it
    proc = nobody("--state-dir", str(state), "sim", "init", base=shared_base)
    one_line_error(proc, f"the state dir {state} belongs to root (uid 0), not to you")
    (state / "sim").mkdir(mode=0o755)
    proc = nobody("--state-dir", str(state), "--backend", "sim", "status", base=shared_base)
    one_line_error(proc, f"the state dir {state} belongs to root (uid 0), not to you")
    # Its own, but unreadable: still one line.
    own = shared_base / "own"
    own.mkdir(mode=0o000)
    os.chown(own, 65534, 65534)
    proc = nobody("--state-dir", str(own), "journal", base=shared_base)
    one_line_error(proc, f"no permission to read the state dir {own}")


def test_unreadable_config_as_nobody_is_one_line(shared_base):
    conf = shared_base / "node.toml"
    conf.write_text("[stagger]\nslots = 1\n")
    conf.chmod(0o600)
    proc = nobody("--state-dir", str(shared_base / "s"), "--config", str(conf), "config", "check",
                  base=shared_base)
    one_line_error(proc, f"no permission to read the node config {conf}")


@pytest.mark.parametrize("flag", ["--proc-root", "--sysfs-root"])
def test_capture_root_that_is_missing_is_refused(cli, tmp_path, flag):
    # A missing /proc tree used to show every GPU process as gone and its VRAM as residual.
    proc = cli(flag, str(tmp_path / "nothing"), "status")
    one_line_error(proc, f"{flag} {tmp_path / 'nothing'} is not a directory")


# --- the node config ---------------------------------------------------------------------------

def test_config_that_is_not_utf8_names_the_line(cli, tmp_path):
    conf = tmp_path / "node.toml"
    conf.write_bytes(b"[stagger]\nslots = 1\n\xff\xfe\n")
    one_line_error(cli("--config", str(conf), "config", "check"), f"{conf}:3: not valid TOML (not UTF-8")


def test_missing_argv_is_blamed_on_the_engine_not_defaults(cli, tmp_path):
    conf = tmp_path / "node.toml"
    conf.write_text('[defaults]\nstop_grace = 5\n\n[[engines]]\nname = "a"\ngpu = 0\n')
    one_line_error(cli("--config", str(conf), "config", "check"), f"{conf}:4: engines[0]: argv must be")


# --- arenas and bundles ------------------------------------------------------------------------

def test_arena_verify_of_a_directory_is_one_line(cli, tmp_path):
    one_line_error(cli("arena", "verify", str(tmp_path)), f"arena {tmp_path} is a directory")
    # inspect agrees with verify: cannot be read is 2, a damaged arena 1
    assert cli("arena", "inspect", str(tmp_path)).returncode == 2


def test_arena_create_where_files_cannot_be_made(cli):
    one_line_error(cli("arena", "create", "/proc/review.arena", "--size", "1MiB"), "cannot create files in /proc")


def test_not_a_bundle_and_truncated_bundle_are_one_line(cli, tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"hello\n")
    one_line_error(cli("--backend", "sim", "status", "--bundle", str(junk)), "is not a readable bundle")
    made = cli("--backend", "sim", "bundle", "--safe-mode", "--output", str(tmp_path / "b.tar.gz"))
    assert made.returncode == 0, made.stderr
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes((tmp_path / "b.tar.gz").read_bytes()[:4000])
    # EOFError from gzip used to surface as "aborted", exit 130
    one_line_error(cli("--backend", "sim", "status", "--bundle", str(cut)), "is truncated")  # names how: its gzip stream ends early
    one_line_error(cli("triage", str(cut)), "is truncated")


def test_triage_refuses_what_is_not_a_kernel_log(cli, tmp_path, fixtures):
    binary = tmp_path / "w.arena"
    binary.write_bytes(os.urandom(4096) + b"\0" * 4096)
    one_line_error(cli("triage", str(binary)), "is not a kernel log (it holds binary data)")
    text = tmp_path / "node.toml"
    text.write_text('[stagger]\nslots = 1\n')
    one_line_error(cli("triage", str(text)), "does not look like a kernel log")
    clean = tmp_path / "clean.log"
    clean.write_text("[    1.000000] Linux version 6.8.0\n[    2.000000] amdgpu: initialized\n")
    assert cli("triage", str(clean)).returncode == 0


def _stand_in(bindir: Path, name: str, pidfile: Path) -> None:
    script = bindir / name
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    script.chmod(0o755)


def test_interrupted_bundle_leaves_no_vendor_tool_running(tmp_path, state_dir):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    pidfile = tmp_path / "rocm-smi.pid"
    _stand_in(bindir, "rocm-smi", pidfile)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    env.pop("GPUWARDEN_BACKEND", None)
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "--backend",
                             "sim", "bundle", "--output", str(tmp_path / "out.tar.gz"), "--timeout", "30"],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in rocm-smi never ran"
        time.sleep(0.02)
    tool = int(pidfile.read_text())
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert not (tmp_path / "out.tar.gz").exists()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{tool}"):
        assert time.monotonic() < deadline, "the stand-in rocm-smi outlived the interrupted bundle"
        time.sleep(0.02)


# --- pipes -------------------------------------------------------------------------------------

def test_reader_closing_the_pipe_is_not_a_failure(state_dir):
    with open(state_dir / "journal.log", "w") as f:
        for i in range(20000):
            f.write(json.dumps({"ts": i, "time": "t", "who": "root", "action": "sim init", "result": "ok"}) + "\n")
    for args in (("journal", "--json", "-n", "0"), ("journal", "-n", "0")):
        proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), *args],
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout.readline()
        proc.stdout.close()  # like `| head -1`
        err = proc.stderr.read().decode()
        # click turned the EPIPE into exit 1, which reads as "needs attention" for status
        assert proc.wait(timeout=30) == 0 and err == "", (args, proc.returncode, err)


def test_status_watch_into_a_pipe_has_no_escape_codes(state_dir):
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(state_dir), "--backend",
                             "sim", "status", "--watch", "--interval", "0.25"],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_signals)
    seen = []
    while sum("Ctrl-C to stop" in line for line in seen) < 2:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        seen.append(line)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "\x1b" not in "".join(seen) + out


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_status_bundle_that_is_not_there_is_one_line(cli, tmp_path, what):
    path = tmp_path / "b.tar.gz" if what == "missing" else tmp_path
    proc = cli("--backend", "sim", "status", "--bundle", str(path))
    one_line_error(proc, "no bundle at" if what == "missing" else f"bundle {path} is a directory")


def test_help_says_what_the_exit_codes_mean():
    top = gpuwarden("--help", check=True).stdout
    assert "Exit status: 0" in top and "130 interrupted" in top
    for cmd in ("drain", "reset", "purge"):
        text = " ".join(gpuwarden(cmd, "--help", check=True).stdout.split())
        assert "without it a script is refused, exit 1, and nothing changes" in text, cmd


def test_state_dir_squatted_in_tmp_by_another_user_is_refused():
    # The non-root default is /tmp/gpuwarden-<uid>; whoever makes that name first must not own our state.
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    squat = Path(tempfile.mkdtemp(prefix="gw-squat-", dir="/tmp"))
    try:
        os.chown(squat, 65534, 65534)
        proc = gpuwarden("--state-dir", str(squat), "journal", env={})
        one_line_error(proc, f"the state dir {squat} belongs to nobody (uid 65534), not to you")
        os.chown(squat, 0, 0)
        assert gpuwarden("--state-dir", str(squat), "journal", env={}).returncode == 0
    finally:
        shutil.rmtree(squat, ignore_errors=True)


def test_state_files_of_the_wrong_shape_are_one_line(cli, state_dir):
    assert cli("sim", "init").returncode == 0
    (state_dir / "baseline.json").write_text("[1, 2]\n")  # valid JSON, not what gpuwarden writes
    one_line_error(cli("baseline", "show"), "baseline.json is corrupt: [1, 2] is not an object")
    # A corrupt baseline is no baseline, with a warning: status still shows the node.
    proc = cli("--backend", "sim", "status")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "warning: idle baseline ignored: state file" in proc.stdout and "baseline.json is corrupt" in proc.stdout
    (state_dir / "baseline.json").unlink()
    (state_dir / "sim" / "node.json").write_text('{"gpus": "x"}\n')
    one_line_error(cli("--backend", "sim", "status"), "node.json is corrupt")
    one_line_error(cli("sim", "show"), "node.json is corrupt")
    assert cli("sim", "init", "--force").returncode == 0
    assert cli("--backend", "sim", "status").returncode == 0


def test_engine_record_of_the_wrong_shape_hides_no_other_engine(cli, state_dir):
    for name, text in (("dp0", "[1]\n"), ("dp1", '{"name": "dp1", "gpu": 1, "phase": "exited", "exit_code": 0}\n')):
        d = state_dir / "engines" / name
        d.mkdir(parents=True)
        (d / "state.json").write_text(text)
    proc = cli("engines", "list")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:3]}
    assert "state file is corrupt" in rows["dp0"] and "exited" in rows["dp1"], proc.stdout
    assert f"dp0: stale — its state file is unreadable; move {d.parent / 'dp0' / 'state.json'} aside" in proc.stdout
    listed = json.loads(cli("engines", "list", "--json").stdout)["engines"]
    assert [e["name"] for e in listed] == ["dp0", "dp1"]


def test_interrupted_playbook_says_so_and_journals_where_it_stopped(cli, state_dir):
    from helpers.simnode import cli_argv, start_tenant
    assert cli("sim", "init").returncode == 0
    tenant = start_tenant(state_dir, 1, "1GiB")  # keeps GPU 1 busy, so drain waits in its last step
    try:
        proc = subprocess.Popen(cli_argv(state_dir, "drain", "1", "--yes", "--timeout", "60"), cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_signals)
        for line in proc.stdout:
            if line.startswith("→ wait"):
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert "drain: interrupted; the steps already done stay done" in err
        entries = read_journal(state_dir)
        assert entries[-1]["action"] == "drain" and entries[-1]["result"] == "interrupted"
        assert entries[-1]["step"] == "wait-idle"
    finally:
        tenant.terminate()
        tenant.wait(timeout=10)


def test_restart_refuses_an_engine_whose_gpu_is_drained(cli, state_dir):
    assert cli("sim", "init").returncode == 0
    assert cli("--backend", "sim", "drain", "1", "--yes", "--timeout", "5").returncode == 0
    d = state_dir / "engines" / "dp1"
    d.mkdir(parents=True)
    (d / "spec.json").write_text(json.dumps({"engine": {"name": "dp1", "gpu": 1, "argv": ["sleep", "60"]}}))
    proc = cli("--backend", "sim", "engines", "restart", "dp1")
    one_line_error(proc, "GPU 1 (engine dp1) is drained", code=1)
    assert not (d / "state.json").exists()  # no shim was started


def test_lock_holder_is_named_like_the_journal_names_operators(cli, state_dir):
    # Under cron or `sudo -i` USER may be unset; the refusal said "locked by 0" there.
    import pwd
    name = pwd.getpwuid(os.geteuid()).pw_name
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom gpuwarden.ops.foundation import gpulock\n"
         "with gpulock.hold(Path(sys.argv[1]), [2], 'drain'):\n    print('held', flush=True)\n    time.sleep(30)\n",
         str(state_dir)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME", "SUDO_USER")})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cli("sim", "init").returncode == 0
        proc = cli("--backend", "sim", "undrain", "2")
        assert proc.returncode == 1
        assert f"GPU 2 is locked by {name} (pid {holder.pid}) running 'drain'" in proc.stdout + proc.stderr
    finally:
        holder.kill()
        holder.wait()


def test_bundle_never_replaces_an_existing_file(cli, tmp_path):
    earlier = tmp_path / "incident.tar.gz"
    earlier.write_bytes(b"evidence of an earlier incident")
    proc = cli("--backend", "sim", "bundle", "--safe-mode", "--output", str(earlier))
    one_line_error(proc, f"{earlier} already exists; it was left as it is")
    assert earlier.read_bytes() == b"evidence of an earlier incident"
    # a new directory named with a trailing slash; two bundles in the same second get two names
    target = str(tmp_path / "new") + "/"
    made = [cli("--backend", "sim", "bundle", "--safe-mode", "--json", "--output", target) for _ in range(2)]
    assert all(p.returncode == 0 for p in made), [p.stderr for p in made]
    assert len({json.loads(p.stdout)["path"] for p in made}) == 2
    assert len(list((tmp_path / "new").glob("*.tar.gz"))) == 2


def test_status_warns_about_a_broken_node_config(cli, tmp_path):
    # Without it the arena panel just said "no arena configured" and a typo went unseen.
    conf = tmp_path / "node.toml"
    conf.write_text("[arena]\npath = /dev/shm/x.arena\n")
    snap = json.loads(cli("--backend", "sim", "--config", str(conf), "status", "--json").stdout)
    assert any(w["code"] == "config-unusable" and w["message"].startswith("node config unusable")
               and f"{conf}:2" in w["message"] for w in snap["warnings"]), snap["warnings"]
    conf.write_text('[arena]\npath = "/dev/shm/x.arena"\nsize = "1GiB"\n')
    snap = json.loads(cli("--backend", "sim", "--config", str(conf), "status", "--json").stdout)
    assert not any(w["code"] == "config-unusable" for w in snap["warnings"]), snap["warnings"]
