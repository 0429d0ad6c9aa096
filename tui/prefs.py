"""The console's remembered settings (theme, refresh, panel layout) in a small file under the XDG config dir.

`$XDG_CONFIG_HOME/gpuwarden/tui.toml` (default ~/.config): read at start, rewritten when one changes.
A file that does not parse is ignored with a note, never fatal: it is only a preference.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

LAYOUTS = ("engines", "processes", "stacked")  # the middle of the screen: engines, processes, or both


@dataclass(frozen=True)
class Prefs:
    theme: str | None = None  # a Textual theme name; None: Textual's default
    refresh: float | None = None  # seconds; None: the command's default
    layout: str = "engines"

    def with_(self, **changes) -> "Prefs":
        return replace(self, **changes)


def path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuwarden" / "tui.toml"


def load(where: Path | None = None) -> tuple[Prefs, str | None]:
    """(prefs, a note when the file was unusable)."""
    where = where or path()
    try:
        data = tomllib.loads(_read_small(where).decode())
    except FileNotFoundError:
        return Prefs(), None
    except (OSError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return Prefs(), f"{where}: ignored ({exc})"
    prefs, bad = Prefs(), []
    theme, refresh, layout = data.get("theme"), data.get("refresh"), data.get("layout")
    if isinstance(theme, str) and theme:
        prefs = prefs.with_(theme=theme)
    elif theme is not None:
        bad.append("theme")
    if isinstance(refresh, (int, float)) and not isinstance(refresh, bool) and refresh > 0:
        prefs = prefs.with_(refresh=float(refresh))
    elif refresh is not None:
        bad.append("refresh")
    if layout in LAYOUTS:
        prefs = prefs.with_(layout=layout)
    elif layout is not None:
        bad.append("layout")
    return prefs, (f"{where}: ignored {', '.join(bad)} (layout is one of {', '.join(LAYOUTS)})" if bad else None)


def _read_small(where: Path, limit: int = 64 << 10) -> bytes:
    """The file's bytes; a FIFO or device put there must not hang the console's start, nor a huge file fill it."""
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {limit >> 10} KiB")
    return data


def save(prefs: Prefs, where: Path | None = None) -> str | None:
    """Write the file (atomically); returns a note instead of raising when it cannot be written."""
    where = where or path()
    lines = ["# gpuwarden console settings: written by the console when you change them"]
    for f in fields(prefs):
        value = getattr(prefs, f.name)
        if value is None:
            continue
        # json.dumps writes a string TOML reads back as the same string (quotes and backslashes escaped).
        lines.append(f"{f.name} = {value!r}" if isinstance(value, float) else f"{f.name} = {json.dumps(value)}")
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_name(f".{where.name}.{os.getpid()}")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, where)
    except OSError as exc:
        return f"settings not saved: {where}: {exc.strerror or exc}"
    return None
