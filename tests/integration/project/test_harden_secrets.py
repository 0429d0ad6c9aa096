"""Secrets planted in a real engine's argv, environment and log reach no sink gpuwarden writes or prints.

A real launch on the simulated node: the engine (sh, holding the sim GPU's device file) gets passwords
and tokens in its command line and environment and prints some to its log. Then every sink is read
and grepped: the journal (file and command), state files, status and engines (text and --json), the
logs as shown, config check, an incident bundle (every member), triage of that bundle.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import stat
import subprocess
from pathlib import Path

from engines.harness import supervised  # noqa: F401  (fixture)
from helpers.simnode import wait_for

ARGV_SECRETS = {"--password": "Argv-Password-111", "--token": "Argv-Token-222"}
CURL_PASS = "Curl-Pass-333"
URL_PASS = "Url-Pass-444"
ENV_SECRETS = {"DB_PWD": "Env-Pwd-555", "MY_PASS": "Env-Pass-666", "HF_TOKEN": "hf_" + "Env7" * 6,
               "AZURE_CONN": "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Env-Azure-888==;"}
LOG_TOKEN = "hf_" + "Log9" * 6
# Issue 25's leaks: a password glued to mysql's -p, sshpass's -p and --sshpass, a W&B key after --wandb, a bare AWS
# secret access key, and a key and its value in separate arguments (which a bundle's proc/PID/cmdline kept).
WANDB_KEY = "a1b2c3d4e5" * 4
AWS_SECRET = "Zq8RkT2vW9xLmN4pQs7uYb3cE6fHj1Ka5dGt0iOw"
# Issue 39: a URL whose user is empty (Redis's form for a password alone), in argv and in the log; a W&B key in
# wandb's own log line ("wandb: ..."), which is redacted within four words of the word wandb.
WANDB_LOG_KEY = "f0e1d2c3b4" * 4
MORE_ARGV = ["mysql", "-uroot", "-pArgv-Glued-A1", "--sshpass", "Argv-Sshpass-A2", "--wandb", WANDB_KEY,
             "token", "Argv-Split-A3", "sshpass", "-p", "Argv-Sshpass-A4", "--cache", "redis://:Argv-Redis-A5@cache:6379"]
MORE_ENV = {"DB_CMD": "mysql -h db -uroot -pEnv-Glued-B1", "SYNC_CMD": f"aws-sync --secret {AWS_SECRET}x"}
LOG_LINES = ["connecting: mysql -h db -uroot -pLog-Glued-C1 app", "fetch with sshpass -p Log-Sshpass-C2 scp",
             "trainer --sshpass Log-Sshpass-C3 --wandb Log-Wandb-C4-key", f"s3 credentials loaded {AWS_SECRET} ok",
             "cache at redis://:Log-Redis-C5@cache:6379/0", f"wandb: key {WANDB_LOG_KEY} saved to netrc"]
PLANTED = [*ARGV_SECRETS.values(), CURL_PASS, URL_PASS, "Env-Pwd-555", "Env-Pass-666", "Env7Env7",
           "Env-Azure-888", "Log9Log9", "Argv-Glued-A1", "Argv-Sshpass-A2", WANDB_KEY, "Argv-Split-A3",
           "Argv-Sshpass-A4", "Env-Glued-B1", "Log-Glued-C1", "Log-Sshpass-C2", "Log-Sshpass-C3", "Log-Wandb-C4",
           AWS_SECRET, "Argv-Redis-A5", "Log-Redis-C5", WANDB_LOG_KEY]

# Holds the sim GPU's device file (so status lists it as a GPU process), prints secrets, serves.
SCRIPT = ('exec 3<"$KFD"; echo "loading with token {tok} and DB_PWD=$DB_PWD"; {more} echo "session is up"; '
          'sleep 300 & wait').format(tok=LOG_TOKEN, more="".join(f"echo '{line}'; " for line in LOG_LINES))


def gw(state: Path, cfg: Path, *args: str) -> subprocess.CompletedProcess:
    """The real CLI in this process (each sink costs a command; interpreters would cost more than them)."""
    from gpuwarden.playbooks.cli import root as cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["--state-dir", str(state), "--config", str(cfg), "--backend", "sim", *args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def leaked(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return [s for s in PLANTED if s in text]


def test_planted_secrets_reach_no_sink(tmp_path, supervised):
    state = supervised
    assert gw(state, tmp_path / "none.toml", "sim", "init", "--gpus", "2").returncode == 0
    argv = ["sh", "-c", SCRIPT, "engine", *[x for kv in ARGV_SECRETS.items() for x in kv],
            "-u", f"svc:{CURL_PASS}", f"https://svc:{URL_PASS}@models.example/x", *MORE_ARGV]
    env = {**ENV_SECRETS, **MORE_ENV, "KFD": str(state / "sim" / "dev" / "kfd"), "NCCL_DEBUG": "WARN"}
    cfg = tmp_path / "node.toml"
    cfg.write_text("[[engines]]\nname = \"e0\"\ngpu = 0\ngated = false\nprogress = \"log\"\n"
                   "registered_pattern = \"session is up\"\nready_pattern = \"session is up\"\n"
                   f"argv = {json.dumps(argv)}\nenv = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in env.items())} }}\n")
    launched = gw(state, cfg, "launch")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    wait_for(lambda: "session is up" in (state / "engines/e0/engine.log").read_text(), 20, "the engine's log")

    sinks: dict[str, str | bytes] = {}
    for args in (("journal",), ("journal", "--json"), ("status",), ("status", "--json"), ("engines", "list"),
                 ("engines", "list", "--json"), ("engines", "logs", "e0"), ("config", "check", "--no-node"),
                 ("config", "check", "--json", "--no-node")):
        proc = gw(state, cfg, *args)
        sinks[" ".join(args)] = proc.stdout + proc.stderr
    bundle = gw(state, cfg, "bundle", "--safe-mode", "--output", str(tmp_path / "b.tar.gz"), "--timeout", "5")
    assert bundle.returncode == 0, bundle.stderr
    sinks["bundle (every member)"] = gzip.decompress((tmp_path / "b.tar.gz").read_bytes())
    for args in (("triage", str(tmp_path / "b.tar.gz")), ("triage", str(tmp_path / "b.tar.gz"), "--json"),
                 ("report", str(tmp_path / "b.tar.gz")), ("report", str(tmp_path / "b.tar.gz"), "--json")):
        proc = gw(state, cfg, *args)
        sinks[" ".join(args[:1] + args[2:])] = proc.stdout + proc.stderr
    # What the sinks above must show, or the test proves nothing: the engine and its line made it there.
    assert "sh -c" in str(sinks["status --json"]) and "[REDACTED:" in str(sinks["status --json"])
    assert "loading with token" in str(sinks["engines logs e0"])

    # The state dir: everything but the spec (the one copy of what to run) and the engine's own output.
    kept_raw = {state / "engines/e0/spec.json", state / "engines/e0/engine.log"}
    for path in state.rglob("*"):
        if path.is_file() and path not in kept_raw:
            sinks[f"state file {path.relative_to(state)}"] = path.read_bytes()
    for path in kept_raw:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path  # readable by the owner only

    found = {name: leaked(text) for name, text in sinks.items() if leaked(text)}
    assert not found, f"secrets reached: {found}"
    # ...and the raw copies really held them (the plant worked).
    assert leaked((state / "engines/e0/spec.json").read_text()) and LOG_TOKEN in (state / "engines/e0/engine.log").read_text()
    environ = [m for m in sinks["bundle (every member)"].split(b"\0") if m.startswith(b"NCCL_DEBUG")]
    assert environ, "the allow-listed variable should be in the bundle's environ"
    assert os.path.exists(state / "engines/e0/state.json")
