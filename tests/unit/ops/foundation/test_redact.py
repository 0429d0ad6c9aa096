"""Redaction's literal prefilter (which spares `status` compiling rules no argument can match) never changes what
is redacted: the same text as running every rule, on texts built to hit the rules, their case variants and the
non-ASCII characters that (?i) folds."""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.ops.foundation import redact


def every_rule(text: str) -> tuple[str, Counter]:
    """redact_text as it was before the prefilter: every rule, compiled, on every text."""
    counts: Counter = Counter()
    text = redact.argv_lists(text, counts)
    for name, regex, group in redact.PATTERNS:
        compiled = re.compile(regex.pattern, regex.flags)
        if name == "secret-assignment":
            text = redact._sub_keyed(name, compiled, group, text, counts)
        else:
            text = redact._sub(name, compiled, group, text, counts)
    return text, counts


FRAGMENTS = [
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "https://user:pw0rd@host/x", "://",
    "Bearer abcdefgh12345", "BASIC dXNlcjpwYXNz", "token", "Token ", "hf_" + "a1" * 11, "sk-proj-" + "x" * 22,
    "AKIA" + "ABCDEFGHIJKLMNOP", "ASIA", "ghp_" + "z" * 32, "github_pat_" + "q" * 41, "xoxb-1234567890ab",
    "eyJhbGciOiJI.eyJzdWIiOiIx.SflKxwRJSMeK", '"--password", "hunter22"', "'-u', 'me:secret'", "--api-key",
    "API_KEY=abcdef", "db_pwd: s3cret", "MY_PASS=xyz123", "auth=", "Credentials: abc123", "passed", "--access-key",
    "=", ":", "@", " ", "\t", "\n", ",", '"', "'", "-", "--", "x", "value", "K", "\u212a", "\u017f", "\u0131",
    "PA\u017fSWORD=zz9911", "TO\u212aEN=abcdef12", "[REDACTED:jwt]", "secret-option",
    "mysql", "MariaDB-dump", "sshpass", "-p", "-pHunter2", "-P3306", "wandb", "--wandb", "login",
    "0123456789abcdef0123456789abcdef01234567", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "\x00",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join)
fuzz = settings(max_examples=400, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@fuzz
@given(text=texts)
def test_prefilter_redacts_exactly_what_every_rule_does(text):
    assert redact.redact_text(text) == every_rule(text)


@fuzz
@given(opt=st.lists(st.sampled_from(["-", "--", "api", "-key", "PASS", "pwd", "Auth", "x", "\u212a", "TO",
                                     "ken", "_", ".", "word", "user"]), min_size=1, max_size=6).map("".join))
def test_option_prefilter_matches_the_option_rule(opt):
    rule = re.compile(redact._SECRET_OPTIONS.pattern, redact._SECRET_OPTIONS.flags)
    assert redact._secret_option(opt) == (opt in redact._USER_OPTIONS or bool(rule.match(opt)))


def test_each_keyword_contains_a_literal():
    """Every word of the secret-key rules, in its shortest spelling, holds one of the literals the filter knows."""
    for alternative in (redact._STRONG + "|" + redact._WEAK).split("|"):
        shortest = alternative.replace("[_-]?", "").removesuffix("s?")
        assert re.fullmatch(r"[a-z]+", shortest), alternative  # a new rule shape: teach this test (and the filter)
        assert any(lit in shortest for lit in redact._KEY_LITERALS), alternative
    assert set(redact._LITERALS) == {name for name, _, _ in redact.PATTERNS}


def test_a_plain_command_line_compiles_no_rule(monkeypatch):
    fresh = tuple((name, redact.LazyRegex(rule.pattern, rule.flags), group) for name, rule, group in redact.PATTERNS)
    monkeypatch.setattr(redact, "PATTERNS", fresh)
    argv = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/llama", "--port",
            "8000"]
    assert redact.command_line(argv) == " ".join(argv)
    assert not any("sub" in vars(rule) for _, rule, _ in fresh)  # nothing compiled
    assert redact.command_line(["curl", "--token", "abc", "-H", "Authorization: Bearer abcdefgh123"]) == \
        "curl --token [REDACTED:secret-option] -H Authorization: Bearer [REDACTED:bearer-token]"


ARG_FRAGMENTS = [f for f in FRAGMENTS if "\x00" not in f]
argvs = st.lists(st.lists(st.sampled_from(ARG_FRAGMENTS), min_size=1, max_size=3).map("".join), max_size=8)


@fuzz
@given(argv=argvs)
def test_a_command_line_reads_the_same_as_a_list_and_as_one_string(argv):
    """One redaction for every sink: what a bundle's proc/PID/cmdline keeps (argument by argument) is already
    what snapshot.json, status and the journal show of the joined line (which they redact as text again)."""
    line = redact.command_line(argv)
    assert redact.text(line) == line
    raw = "\0".join(argv).encode() + b"\0"
    assert redact.cmdline_bytes(raw)[0].decode().rstrip("\0").replace("\0", " ") == line


def test_the_secrets_that_leaked_are_redacted_in_every_form():
    """Issue 25's leaks, as an argument list, one joined line and a log line."""
    aws = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    wandb = "0123456789abcdef0123456789abcdef01234567"
    cases = [(["mysql", "-uroot", "-pGlued-Pw-1", "app"], "Glued-Pw-1"),
             (["/usr/bin/mariadb-dump", "-h", "db", "-P3306", "-pGlued-Pw-2"], "Glued-Pw-2"),
             (["sshpass", "-p", "Sshpass-Pw-3", "ssh", "node1"], "Sshpass-Pw-3"),
             (["sshpass", "-pSshpass-Pw-4", "ssh", "node1"], "Sshpass-Pw-4"),
             (["fleetctl", "--sshpass", "Sshpass-Opt-5"], "Sshpass-Opt-5"),
             (["fleetctl", "--sshpass=Sshpass-Opt-6"], "Sshpass-Opt-6"),
             (["train.py", "--wandb", wandb], wandb), (["train.py", "--wandb=" + wandb], wandb),
             (["wandb", "login", wandb], wandb), (["sync", aws], aws),
             (["x", "token", "split-token-7"], "split-token-7"), (["x", "password:", "split-pw-8"], "split-pw-8")]
    for argv, secret in cases:
        assert secret not in redact.command_line(argv), argv
        assert secret not in redact.cmdline_bytes("\0".join(argv).encode())[0].decode(), argv
        assert secret not in redact.text(" ".join(argv)), argv
        assert secret not in redact.text(f"2026-12-01 12:00:00 INFO launching {' '.join(argv)} now"), argv
    # ... and what only looks alike stays: a port glued to -p, gcc's -pthread, a git digest, W&B's own log lines
    for keep in ("gcc -pthread -O2 -p8080", "commit " + wandb, "wandb: Syncing run quiet-sky-12",
                 "ssh -p 2222 node1", "/models/Llama3/Weights/Shard01/ModelPart1/x.bin", "--wandb-project llama"):
        assert redact.text(keep) == keep and redact.command_line(keep.split()) == keep
