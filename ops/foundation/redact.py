"""Secret redaction for every sink gpuwarden writes: journal, state, bundles, triage quotes, --json output.

The pattern list below is the documented one (`gpuwarden bundle --help` points here). Each hit is
replaced by [REDACTED:<pattern name>]; callers get counts per pattern name, never the values. Command
lines are redacted argument by argument; a bundle keeps only an allow-list of a process environment.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

from gpuwarden.ops.foundation.lazyregex import LazyRegex

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status` starts without it
if TYPE_CHECKING:
    from typing import Any, Iterable

# Variable/key names whose value is a secret whatever it looks like.
SECRET_NAME = LazyRegex(
    r"(?i)(?:PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|ACCOUNT_?KEY"
    r"|CREDENTIALS?|AUTH|SESSION_?KEY|SIGNING_?KEY|COOKIE|CONNECTION_?STRING|(?:^|_)PASS$|(?:^|_)PWD$|_PASS_)")

# Words that make a key's value secret wherever they sit in the key ...
_STRONG = (r"password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|account[_-]?key"
           r"|shared[_-]?access[_-]?key|credentials?|auth")
# ... and short ones that only count at the key's end (MY_PASS, DB_PWD), not inside words (passed, bypassing).
_WEAK = r"pass|pwd"
_KEYWORDS = rf"(?:{_STRONG}|(?:{_WEAK})(?=[\"'\s=:\x00]))"

# (name, regex, group holding the secret) applied to text; order matters (specific first).
# Compiled at first use: `status` imports this module but redacts only when it shows a process.
PATTERNS: tuple[tuple[str, LazyRegex, int], ...] = (
    ("private-key-block", LazyRegex(
        r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]*?(?:-----END (?:[A-Z]+ )*PRIVATE KEY-----|$)"), 0),
    ("url-credentials", LazyRegex(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@\x00]+:)([^@\s/\x00]+)(@)"), 2),
    ("bearer-token", LazyRegex(r"(?i)\b(Bearer|Basic|Token)[\s\x00]+([A-Za-z0-9._~+/=-]{8,})"), 2),
    ("huggingface-token", LazyRegex(r"\b(hf_[A-Za-z0-9]{20,})\b"), 1),
    ("openai-key", LazyRegex(r"\b(sk-(?:proj-|ant-|live-)?[A-Za-z0-9_-]{20,})\b"), 1),
    ("aws-access-key-id", LazyRegex(r"\b((?:AKIA|ASIA)[0-9A-Z]{16})\b"), 1),
    ("github-token", LazyRegex(r"\b((?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b"), 1),
    ("slack-token", LazyRegex(r"\b(xox[abprs]-[A-Za-z0-9-]{10,})\b"), 1),
    ("jwt", LazyRegex(r"\b(eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})\b"), 1),
    # The mysql family and sshpass take a password glued to -p (mysql -uroot -phunter2); sshpass also takes it as
    # the next word. Elsewhere a glued -p is no secret (gcc -pthread, -p8080), so the command word must come first.
    ("glued-password", LazyRegex(
        r"(?<![\w.-])((?i:mysql\w*|mariadb[\w-]*|sshpass)(?:[ \t\x00]+(?!-p)[^\s\x00]+){0,16}?[ \t\x00]+-p)"
        r"(?!\[REDACTED)([^\s\x00\"']+)"), 2),
    ("sshpass-password", LazyRegex(
        r"(?<![\w.-])((?i:sshpass)(?:[ \t\x00]+(?!-p)[^\s\x00]+){0,8}?[ \t\x00]+-p[ \t\x00]+)"
        r"(?!\[REDACTED)([^\s\x00\"']+)"), 2),
    # Weights & Biases: its key as the value of --wandb / --wandb-key, or the 40 hex digits of `wandb login KEY`.
    ("wandb-option", LazyRegex(
        r"(?i)(?<![\w.-])(--?wandb(?:[-_](?:api[-_])?key)?(?:[ \t\x00]+|=))(?!\[REDACTED)([^\s\x00\"',;&]{3,})"), 2),
    ("wandb-key", LazyRegex(
        r"(?i)(?<![\w.-])(wandb(?:[ \t\x00]+[^\s\x00]+){0,4}?[ \t\x00]+)((?:local-)?[0-9a-f]{40})(?![\w-])"), 2),
    # A bare AWS secret access key: 40 characters of base64's alphabet standing alone; see _aws_secret for the
    # checks (mixed case and digits, the spread of a random key) that spare paths and hex digests.
    ("aws-secret-access-key", LazyRegex(r"(?<![A-Za-z0-9/+=])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"), 1),
    # A command line kept as a list (JSON, TOML, Python's repr): "--password", "x" and "-u", "user:x".
    ("secret-option", LazyRegex(
        r"(?i)([\"'])(--?[\w.-]*?(?:" + _STRONG + r"|(?<![a-z])(?:pass|pwd)(?![a-z]))[\w.-]*)\1(\s*,\s*)([\"'])"
        r"(?!\[REDACTED)([^\"'\n]{1,4096}?)\4"), 5),
    ("option-credentials", LazyRegex(
        r"([\"'])(-u|-U|--user|--proxy-user|--username|--basic-auth|--creds)\1(\s*,\s*)([\"'])([^\"':\n]*:)"
        r"(?!\[REDACTED)([^\"'\n]{1,4096}?)\4"), 6),
    # key=value, key: value, "key": "value" with a secret-sounding key; or a --flag followed by its value
    ("secret-assignment", LazyRegex(
        # (?<!...) starts keys at a token boundary only: scanning from inside every word is quadratic
        r"(?i)(?<![\w.-])((?:--?[\w.-]*?" + _KEYWORDS + r"[\w.-]*(?:[ \t\x00]+|=))"
        r"|(?:[\w.-]*?" + _KEYWORDS + r"[\w.-]*\"?[ \t\x00]*[=:][ \t\x00]*\"?))"
        r"(?!(?:Bearer|Basic|Token)[ \t]|\[REDACTED)([^\s\"',\x00;&]{3,})"), 2),
)

# Lower-case literals of which every match of a rule contains one: an ASCII text that holds none cannot match
# the rule, which is then neither compiled nor run. Most arguments and log lines hold none, and compiling every
# rule costs ~4 ms of a 40 ms `status`. Text with non-ASCII characters runs every rule: (?i) also matches the
# Kelvin sign and the long s, which lower() does not turn into k and s.
_KEY_LITERALS = ("pass", "pwd", "secret", "token", "api", "access", "private", "account", "credential", "auth")
_LITERALS = {
    "private-key-block": ("-----begin ",),
    "url-credentials": ("://",),
    "bearer-token": ("bearer", "basic", "token"),
    "huggingface-token": ("hf_",),
    "openai-key": ("sk-",),
    "aws-access-key-id": ("akia", "asia"),
    "github-token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "slack-token": ("xox",),
    "jwt": ("eyj",),
    "glued-password": ("mysql", "mariadb", "sshpass"),
    "sshpass-password": ("sshpass",),
    "wandb-option": ("wandb",),
    "wandb-key": ("wandb",),
    "aws-secret-access-key": None,  # no literal: see _MIN_LENGTH
    "secret-option": ('"', "'"),
    "option-credentials": ('"', "'"),
    "secret-assignment": _KEY_LITERALS,
}


def _lowered(text: str) -> str | None:
    """The text to look for rule literals in; None when literals cannot rule anything out."""
    return text.lower() if text.isascii() else None


_ANY_LITERAL = tuple(sorted({s for literals in _LITERALS.values() if literals for s in literals}))
# Rules without a literal run only on texts at least this long (every match is that long).
_MIN_LENGTH = {"aws-secret-access-key": 40}
_SHORTEST_UNFILTERED = min(_MIN_LENGTH.values())
# The rules whose match can run across a command line's arguments (a key in one, its value in the next).
_SPANNING = frozenset({"bearer-token", "secret-assignment", "glued-password", "sshpass-password", "wandb-option",
                       "wandb-key"})


def _may_match(literals: tuple[str, ...], lowered: str | None) -> bool:
    return lowered is None or any(map(lowered.__contains__, literals))


def _rule_may_match(name: str, text: str, lowered: str | None) -> bool:
    literals = _LITERALS[name]
    if literals is None:
        return len(text) >= _MIN_LENGTH[name]
    return _may_match(literals, lowered)


def _aws_secret(value: str) -> bool:
    """Whether 40 base64 characters look like a generated AWS secret rather than a path, digest or word run:
    upper and lower case and a digit (hex digests have no upper case), few slashes (a path has one per part)
    and the spread of random text (Shannon entropy >= 4 bits/char; 100,000 random keys never went under 4.1)."""
    if not (any(c.isupper() for c in value) and any(c.islower() for c in value) and any(c.isdigit() for c in value)):
        return False
    if value.count("/") + value.count("+") > 4:
        return False
    counts = Counter(value)
    entropy = -sum(n / 40 * math.log2(n / 40) for n in counts.values())
    return entropy >= 4.0


_MARK = "[REDACTED:{}]"

# Command-line options whose next argument (or =value) is a secret whole, or user:secret (curl -u).
# pass/pwd count where a word ends (--sshpass, --db-pwd), as in the key=value rule; not inside one (--passes).
_SECRET_OPTIONS = LazyRegex(r"(?i)^--?[\w.-]*(?:" + _STRONG + r"|(?:pass|pwd)(?![a-z]))[\w.-]*$")
_WANDB_OPTION = LazyRegex(r"(?i)^--?wandb(?:[-_](?:api[-_])?key)?$")
_USER_OPTIONS = frozenset({"-u", "--user", "--proxy-user", "-U", "--username", "--basic-auth", "--creds"})
_BARE_USERINFO = LazyRegex(r"^([^:@/\s]+):([^@\s]+)@([^@\s]+)$")  # user:pass@host without a scheme


def _sub(name: str, regex: LazyRegex, group: int, text: str, counts: Counter[str]) -> str:
    def repl(m: re.Match[str]) -> str:
        value = m.group(group)
        if value.startswith("[REDACTED:") or (name == "aws-secret-access-key" and not _aws_secret(value)):
            return m.group(0)
        counts[name] += 1
        if group == 0:
            return _MARK.format(name)
        start, end = m.start(group) - m.start(0), m.end(group) - m.start(0)
        whole = m.group(0)
        return whole[:start] + _MARK.format(name) + whole[end:]
    out: str = regex.sub(repl, text)
    return out


_KEY_HINT = LazyRegex(_KEYWORDS, re.IGNORECASE)


def _sub_keyed(name: str, regex: LazyRegex, group: int, text: str, counts: Counter[str]) -> str:
    """The key=value rule, run only on lines that mention a secret word (most log lines do not)."""
    if not _KEY_HINT.search(text):
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if _KEY_HINT.search(line):
            lines[i] = _sub(name, regex, group, line, counts)
    return "\n".join(lines)


# A list of quoted strings written out (TOML and JSON arrays, Python's repr): an argv in a config file, a log line.
_QUOTED = r"(?:\"(?:[^\"\\\n]|\\.){0,4096}\"|'[^'\n]{0,4096}')"
_STRING_LIST = LazyRegex(r"\[[ \t]*" + _QUOTED + r"(?:[ \t]*,[ \t]*" + _QUOTED + r")+[ \t]*,?[ \t]*\]")
_ONE_QUOTED = LazyRegex(_QUOTED)


def argv_lists(text: str, counts: Counter[str]) -> str:
    """Each written-out list of strings redacted as the command line it may be, so that node.toml's
    `argv = ["mysql", "-pX"]` loses what the same argv loses in status or a bundle's proc/PID/cmdline."""
    if "[" not in text or ('"' not in text and "'" not in text):
        return text

    def one_list(m: re.Match[str]) -> str:
        tokens = list(_ONE_QUOTED.finditer(m.group(0)))
        items = [_unquote(t.group(0)) for t in tokens]
        known = [i for i in items if i is not None]
        if len(known) < len(items):
            return m.group(0)
        red, _ = redact_argv(known, counts)
        whole, shift = m.group(0), 0
        for token, before, after in zip(tokens, items, red):
            if before == after:
                continue
            quoted = json.dumps(after, ensure_ascii=False) if token.group(0)[0] == '"' else "'" + after + "'"
            whole = whole[:token.start() + shift] + quoted + whole[token.end() + shift:]
            shift += len(quoted) - (token.end() - token.start())
        return whole
    out: str = _STRING_LIST.sub(one_list, text)
    return out


def _unquote(token: str) -> str | None:
    if token[0] == "'":
        return token[1:-1]
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, str) else None  # a double-quoted token decodes to a string


def redact_text(text: str, counts: Counter[str] | None = None, *, rules: frozenset[str] | None = None
                ) -> tuple[str, Counter[str]]:
    """Text with every known secret shape replaced; counts per pattern name. `rules` limits the rules run."""
    counts = counts if counts is not None else Counter()
    if rules is None:
        text = argv_lists(text, counts)
    lowered = _lowered(text)
    if len(text) < _SHORTEST_UNFILTERED and not _may_match(_ANY_LITERAL, lowered):
        return text, counts  # most arguments and lines: no rule can match
    for name, regex, group in PATTERNS:
        if (rules is not None and name not in rules) or not _rule_may_match(name, text, lowered):
            continue
        before = text
        if name == "secret-assignment":
            text = _sub_keyed(name, regex, group, text, counts)
        else:
            text = _sub(name, regex, group, text, counts)
        if text is not before:  # a mark went in (its words may be a later rule's literals)
            lowered = _lowered(text)
    return text, counts


def text(value: str) -> str:
    """redact_text without the counts: for one-line sinks (journal fields, status output)."""
    return redact_text(value)[0]


def redact_argv(argv: Iterable[str], counts: Counter[str] | None = None) -> tuple[list[str], Counter[str]]:
    """A command line with secret option values, user:password pairs and known token shapes replaced."""
    counts = counts if counts is not None else Counter()
    out: list[str] = []
    pending: str | None = None  # the option whose value the next argument is
    for arg in argv:
        arg = str(arg)
        if pending is not None:
            out.append(_option_value(pending, arg, counts))
            pending = None
            continue
        opt, eq, value = arg.partition("=")
        if arg.startswith("-") and _secret_option(opt):
            if eq:
                out.append(opt + "=" + _option_value(opt, value, counts))
            else:
                out.append(arg)
                pending = opt
            continue
        bare = _BARE_USERINFO.match(arg) if "@" in arg and ":" in arg else None
        if bare and "://" not in arg:
            counts["url-credentials"] += 1
            arg = f"{bare.group(1)}:{_MARK.format('url-credentials')}@{bare.group(3)}"
        out.append(redact_text(arg, counts)[0])
    return _across_arguments(out, counts), counts


def _across_arguments(args: list[str], counts: Counter[str]) -> list[str]:
    """The rules whose key and value may be separate arguments (`mysql -u root -pX`, `password: X`, `Token X`),
    run over the arguments joined by NUL, which those rules take for a space: so a command line shows the same
    whether a sink keeps it as a list (a bundle's proc/PID/cmdline) or as one string (snapshot.json, status)."""
    if len(args) < 2 or any("\0" in a for a in args):
        return args
    joined = "\0".join(args)
    redacted, _ = redact_text(joined, counts, rules=_SPANNING)
    if redacted is joined or redacted == joined:
        return args
    parts = redacted.split("\0")
    return parts if len(parts) == len(args) else [redact_text(a)[0] for a in args]


def _secret_option(opt: str) -> bool:
    return (opt in _USER_OPTIONS or (_may_match(_KEY_LITERALS, _lowered(opt)) and bool(_SECRET_OPTIONS.match(opt)))
            or ("wandb" in opt.lower() and bool(_WANDB_OPTION.match(opt))))


def _option_value(opt: str, value: str, counts: Counter[str]) -> str:
    if value.startswith("[REDACTED:"):
        return value
    if opt in _USER_OPTIONS:
        user, colon, _ = value.partition(":")
        if not colon:
            return value  # a user name alone (mysql -u root) is no secret
        counts["option-credentials"] += 1
        return f"{user}:{_MARK.format('option-credentials')}"
    counts["secret-option"] += 1
    return _MARK.format("secret-option")


def command_line(argv: Iterable[str]) -> str:
    """A command line for display and storage: redacted, arguments joined by spaces."""
    return " ".join(redact_argv(argv)[0])


def cmdline_bytes(raw: bytes, counts: Counter[str] | None = None) -> tuple[bytes, Counter[str]]:
    """/proc/<pid>/cmdline (NUL-separated) redacted argument by argument."""
    args = raw.decode("utf-8", errors="surrogateescape").split("\0")
    trailing = args and args[-1] == ""
    red, counts = redact_argv(args[:-1] if trailing else args, counts)
    return ("\0".join(red) + ("\0" if trailing else "")).encode("utf-8", errors="surrogateescape"), counts


# --- environments ------------------------------------------------------------------------------

# What a bundle keeps of a process environment: GPU visibility and the runtime/collective tuning
# variables that change how a GPU job behaves, and the search paths that decide which libraries load.
ENV_ALLOWED_PREFIXES = ("ROCM_", "ROCR_", "HIP_", "HSA_", "HSAKMT_", "AMD_", "GPU_", "MIOPEN_", "ROCBLAS_",
                        "HIPBLASLT_", "TENSILE_", "CUDA_", "NVIDIA_", "CUBLAS_", "CUDNN_", "NCCL_", "RCCL_",
                        "TORCH_", "PYTORCH_", "GPUWARDEN_")
ENV_ALLOWED_NAMES = frozenset({"PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "LIBRARY_PATH", "PYTHONPATH", "CPATH",
                               "HOME", "CUDA_HOME", "OMP_NUM_THREADS"})


def env_allowed(name: str) -> bool:
    return name in ENV_ALLOWED_NAMES or name.startswith(ENV_ALLOWED_PREFIXES)


def redact_environ(raw: bytes, counts: Counter[str] | None = None) -> tuple[bytes, Counter[str]]:
    """A NUL-separated environment (/proc/<pid>/environ): only allow-listed variables stay, and even
    those lose a value whose name says secret; then the text rules."""
    counts = counts if counts is not None else Counter()
    out = []
    for item in raw.split(b"\0"):
        if not item:
            continue
        name, sep, value = item.partition(b"=")
        text_name = name.decode(errors="replace")
        if not sep or not env_allowed(text_name):
            counts["env-not-allow-listed"] += 1
            continue
        if value and SECRET_NAME.search(text_name):
            counts["env-secret-name"] += 1
            item = name + b"=" + _MARK.format("env-secret-name").encode()
        # each variable alone: a rule must not take the next variable for an empty one's value
        out.append(redact_text(item.decode("utf-8", errors="surrogateescape"), counts)[0]
                   .encode("utf-8", errors="surrogateescape"))
    return b"\0".join(out) + (b"\0" if out else b""), counts


def env_mapping(env: dict[str, str]) -> dict[str, str]:
    """An engine's configured environment for display (config check --json): secret-named values go."""
    return {k: (_MARK.format("env-secret-name") if SECRET_NAME.search(k) else text(str(v))) for k, v in env.items()}


def redact_bytes(data: bytes, *, environ: bool = False, cmdline: bool = False) -> tuple[bytes, Counter[str]]:
    if environ:
        return redact_environ(data)
    if cmdline:
        return cmdline_bytes(data)
    out, counts = redact_text(data.decode("utf-8", errors="surrogateescape"))
    return out.encode("utf-8", errors="surrogateescape"), counts


def value(obj: Any, key: str | None = None) -> Any:
    """A JSON-able value with every string redacted; lists under an argv-like key as command lines."""
    if isinstance(obj, str):
        if key is not None and SECRET_NAME.search(key):
            return _MARK.format("secret-name") if obj else obj
        return text(obj)
    if isinstance(obj, dict):
        return {k: value(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if key in ("argv", "command", "cmdline", "args") and all(isinstance(a, str) for a in obj):
            return redact_argv(obj)[0]
        return [value(v) for v in obj]
    return obj


def describe() -> list[tuple[str, str]]:
    """(name, what it catches) for --help and the manifest."""
    return [
        ("env-not-allow-listed", "bundles keep only GPU visibility, ROCm/HIP/HSA/CUDA/NCCL/RCCL/TORCH tuning and "
                                 "PATH-like variables of a process environment; the rest is dropped"),
        ("env-secret-name", "allow-listed variables whose name says secret (…TOKEN, …PASSWORD, …_PWD, …)"),
        ("secret-option", "the value of a command-line option named like a secret (--password, --token, --api-key), "
                          "as arguments or in a list (\"--password\", \"x\")"),
        ("option-credentials", "the password of -u/--user user:password (curl and friends), also in a list"),
    ] + [(name, regex.pattern[:80]) for name, regex, _ in PATTERNS if name not in ("secret-option", "option-credentials")]
