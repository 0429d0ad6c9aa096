"""Commands named in hints must work when pasted: they get the global options this command was given.

`gpuwarden --state-dir /x purge 2` that says "run `gpuwarden fix 2`" means `gpuwarden --state-dir /x fix 2`.
"""

from __future__ import annotations

import re
import shlex

# A backticked gpuwarden command (optionally under sudo); _BARE: one that names no global option yet.
_COMMAND = r"`((?:sudo )?gpuwarden) ([^`]+)`"
_BARE = r"`((?:sudo )?gpuwarden) (?!-)([^`]+)`"


class Invocation:
    """The global options given on this command line (not those from GPUWARDEN_* variables, which a
    pasted command inherits anyway), as words to repeat in every command a hint names.

    A plain class, not a dataclass: status imports this, and dataclasses costs it 14 ms of start-up."""

    def __init__(self, words: list[str] | None = None):
        self.words: list[str] = list(words or [])

    def paste_ready(self, text: str | None) -> str | None:
        if not text or not self.words:
            return text
        prefix = " ".join(shlex.quote(w) for w in self.words)
        return re.sub(_BARE, lambda m: f"`{m.group(1)} {prefix} {m.group(2)}`", text)


def commands_in(text: str) -> list[str]:
    """Every backticked gpuwarden command in `text` (tests paste them)."""
    return [f"{m.group(1)} {m.group(2)}" for m in re.finditer(_COMMAND, text or "")]
