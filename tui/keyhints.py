"""Hints inside the console name the key, not the shell command: "select GPU 1 and press d" for `gpuwarden drain 1`.

Playbooks word their hints for the CLI; in the TUI the operator is one key away, and a pasted command is not.
"""

from __future__ import annotations

import re

from gpuwarden.tui.actions import ACTIONS

_GPU_VERBS = {a.name: a.key for a in ACTIONS if a.needs == "gpu"}
# A backticked `gpuwarden VERB N` (global options allowed before the verb), optionally after "run".
_GPU_COMMAND = re.compile(r"(?:run )?`(?:sudo )?gpuwarden (?:--?\S+ \S+ )*(" + "|".join(_GPU_VERBS) + r") (\d+)`")


def with_keys(text: str | None) -> str:
    """`text` with every GPU command that an action key runs put as that key."""
    if not text:
        return text or ""
    return _GPU_COMMAND.sub(lambda m: f"select GPU {m.group(2)} and press {_GPU_VERBS[m.group(1)]}", text)
