"""Commands named in hints must work when pasted: they get the global options this command was given.

`gpuwarden --state-dir /x purge 2` that says "run `gpuwarden fix 2`" means `gpuwarden --state-dir /x fix 2`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

# A backticked gpuwarden command (optionally under sudo); _BARE: one that names no global option yet.
_COMMAND = re.compile(r"`((?:sudo )?gpuwarden) ([^`]+)`")
_BARE = re.compile(r"`((?:sudo )?gpuwarden) (?!-)([^`]+)`")


@dataclass
class Invocation:
    """The global options given on this command line (not those from GPUWARDEN_* variables, which a
    pasted command inherits anyway), as words to repeat in every command a hint names."""

    words: list[str] = field(default_factory=list)

    def paste_ready(self, text: str | None) -> str | None:
        if not text or not self.words:
            return text
        prefix = " ".join(shlex.quote(w) for w in self.words)
        return _BARE.sub(lambda m: f"`{m.group(1)} {prefix} {m.group(2)}`", text)


def commands_in(text: str) -> list[str]:
    """Every backticked gpuwarden command in `text` (tests paste them)."""
    return [f"{m.group(1)} {m.group(2)}" for m in _COMMAND.finditer(text or "")]
