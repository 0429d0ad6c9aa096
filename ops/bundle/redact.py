"""Secret redaction for everything that goes into a bundle: environments, command lines, logs.

The pattern list below is the documented one (`gpuwarden bundle --help` points here). Each hit is
replaced by [REDACTED:<pattern name>]; callers get counts per pattern name, never the values.
"""

from __future__ import annotations

import re
from collections import Counter

# Variable/key names whose value is a secret whatever it looks like.
SECRET_NAME = re.compile(
    r"(?i)(?:^|_|-)?(?:[A-Z0-9]*?)(?:PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
    r"|CREDENTIALS?|AUTH|SESSION_?KEY|SIGNING_?KEY|COOKIE)(?:[A-Z0-9_]*)$")

_KEYWORDS = r"(?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credentials?|auth)"

# (name, regex, group holding the secret) applied to text; order matters (specific first).
PATTERNS: tuple[tuple[str, re.Pattern, int], ...] = (
    ("private-key-block", re.compile(
        r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]*?(?:-----END (?:[A-Z]+ )*PRIVATE KEY-----|$)"), 0),
    ("url-credentials", re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@\x00]+:)([^@\s/\x00]+)(@)"), 2),
    ("bearer-token", re.compile(r"(?i)\b(Bearer|Basic|Token)\s+([A-Za-z0-9._~+/=-]{8,})"), 2),
    ("huggingface-token", re.compile(r"\b(hf_[A-Za-z0-9]{20,})\b"), 1),
    ("openai-key", re.compile(r"\b(sk-(?:proj-|ant-|live-)?[A-Za-z0-9_-]{20,})\b"), 1),
    ("aws-access-key-id", re.compile(r"\b((?:AKIA|ASIA)[0-9A-Z]{16})\b"), 1),
    ("github-token", re.compile(r"\b((?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b"), 1),
    ("slack-token", re.compile(r"\b(xox[abprs]-[A-Za-z0-9-]{10,})\b"), 1),
    ("jwt", re.compile(r"\b(eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})\b"), 1),
    # key=value, key: value, "key": "value" with a secret-sounding key; or a --flag followed by its value
    ("secret-assignment", re.compile(
        # (?<!...) starts keys at a token boundary only: scanning from inside every word is quadratic
        r"(?i)(?<![\w.-])((?:--?[\w.-]*?" + _KEYWORDS + r"[\w.-]*(?:[ \t]+|\x00|=))"
        r"|(?:[\w.-]*?" + _KEYWORDS + r"[\w.-]*\"?[ \t]*[=:][ \t]*\"?))"
        r"(?!(?:Bearer|Basic|Token)[ \t]|\[REDACTED)([^\s\"',\x00;&]{3,})"), 2),
)

_MARK = "[REDACTED:{}]"


def _sub(name: str, regex: re.Pattern, group: int, text: str, counts: Counter) -> str:
    def repl(m: re.Match) -> str:
        value = m.group(group)
        if value.startswith("[REDACTED:"):
            return m.group(0)
        counts[name] += 1
        if group == 0:
            return _MARK.format(name)
        start, end = m.start(group) - m.start(0), m.end(group) - m.start(0)
        whole = m.group(0)
        return whole[:start] + _MARK.format(name) + whole[end:]
    return regex.sub(repl, text)


_KEY_HINT = re.compile(_KEYWORDS, re.IGNORECASE)


def _sub_keyed(name: str, regex: re.Pattern, group: int, text: str, counts: Counter) -> str:
    """The key=value rule, run only on lines that mention a secret word (most log lines do not)."""
    if not _KEY_HINT.search(text):
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if _KEY_HINT.search(line):
            lines[i] = _sub(name, regex, group, line, counts)
    return "\n".join(lines)


def redact_text(text: str, counts: Counter | None = None) -> tuple[str, Counter]:
    """Text with every known secret shape replaced; counts per pattern name."""
    counts = counts if counts is not None else Counter()
    for name, regex, group in PATTERNS:
        if name == "secret-assignment":
            text = _sub_keyed(name, regex, group, text, counts)
        else:
            text = _sub(name, regex, group, text, counts)
    return text, counts


def redact_environ(raw: bytes, counts: Counter | None = None) -> tuple[bytes, Counter]:
    """A NUL-separated environment (/proc/<pid>/environ): secret-named values go, then the text rules."""
    counts = counts if counts is not None else Counter()
    out = []
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and value and SECRET_NAME.search(name.decode(errors="replace")):
            counts["env-secret-name"] += 1
            item = name + b"=" + _MARK.format("env-secret-name").encode()
        out.append(item)
    text, counts = redact_text(b"\0".join(out).decode("utf-8", errors="surrogateescape"), counts)
    return text.encode("utf-8", errors="surrogateescape"), counts


def redact_bytes(data: bytes, *, environ: bool = False) -> tuple[bytes, Counter]:
    if environ:
        return redact_environ(data)
    text, counts = redact_text(data.decode("utf-8", errors="surrogateescape"))
    return text.encode("utf-8", errors="surrogateescape"), counts


def describe() -> list[tuple[str, str]]:
    """(name, what it catches) for --help and the manifest."""
    return [("env-secret-name", "environment variables whose name says secret (…TOKEN, …PASSWORD, …API_KEY, …)")] + [
        (name, regex.pattern[:80]) for name, regex, _ in PATTERNS]
