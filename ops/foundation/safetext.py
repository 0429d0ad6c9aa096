"""Text read from files, processes or bundles, made safe to print: terminal escapes are shown, never obeyed.

An arena header, a process command line or a stranger's bundle can carry ESC sequences (set the title,
write the clipboard, move the cursor); everything gpuwarden prints from such a source passes here.
"""

from __future__ import annotations

import re

from gpuwarden.ops.foundation.lazyregex import LazyRegex

# C0 controls but tab and newline, DEL, C1 controls, and the bidi overrides that reorder what is shown.
_CONTROL = LazyRegex("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_COLOUR = LazyRegex(r"\x1b\[[0-9;]*m")


def _show(m: re.Match[str]) -> str:
    c = m.group(0)
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` with every control character shown as \\xNN; newlines kept only when asked."""
    if text.isprintable() or not text:
        return text
    out: str = _CONTROL.sub(_show, text)
    if not newlines:
        out = out.replace("\n", "\\n")
    return out


def log_line(text: str) -> str:
    """An engine's log line: colour codes dropped (engines colour their logs), anything else shown."""
    return printable(_COLOUR.sub("", text))


def clean(obj: object) -> object:
    """A JSON-shaped value with every string made printable (for snapshots read back from bundles)."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {clean(k) if isinstance(k, str) else k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    return obj
