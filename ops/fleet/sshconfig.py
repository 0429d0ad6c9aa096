"""Check an OpenSSH client config (--ssh-config) once, before any node is reached: a regular file of bounded
size, its Include files too, and no Include loop. asyncssh re-reads it for every host, unbounded and recursively.

Include is resolved as asyncssh resolves it (asyncssh/config.py, SSHConfig._include): ~ expanded, a relative
pattern taken under ~/.ssh, globbed, regular files only.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.inputs import read_regular
from gpuwarden.ops.foundation.units import fmt_bytes

# A hand-written config is a few KiB; a generated one for ten thousand hosts about 1 MiB. The cap is on the
# config and everything it includes together, since asyncssh parses all of it again for every host.
MAX_SSH_CONFIG_BYTES = 4 << 20
# OpenSSH stops at this include depth too (readconf.c, READCONF_MAX_DEPTH).
MAX_INCLUDE_DEPTH = 16
HINT = "give an OpenSSH client config file (ssh_config(5)) of at most " + fmt_bytes(MAX_SSH_CONFIG_BYTES)


def check_ssh_config(path: Path) -> None:
    """Refuse, in one GpuwardenError, a config that is missing, not a regular file (a FIFO or a directory is
    named as one), over MAX_SSH_CONFIG_BYTES with its includes, or that includes itself."""
    _walk(Path(path), [], [0])


def _walk(path: Path, chain: list[Path], total: list[int]) -> None:
    what = "--ssh-config file" if not chain else "file the --ssh-config includes"
    real = path.resolve()
    if real in chain:
        loop = " -> ".join(str(p) for p in [*chain[chain.index(real):], real])
        raise GpuwardenError(f"--ssh-config {chain[0]} includes itself: {loop}", "remove the Include that loops back")
    if len(chain) >= MAX_INCLUDE_DEPTH:
        raise GpuwardenError(f"--ssh-config {chain[0]} nests Include more than {MAX_INCLUDE_DEPTH} deep (at {path})",
                             "flatten the includes")
    try:
        data = read_regular(path, what, MAX_SSH_CONFIG_BYTES - total[0], HINT)
    except GpuwardenError as exc:
        if total[0] and "larger than" in exc.message:
            raise GpuwardenError(f"--ssh-config {chain[0]} with its includes is larger than "
                                 f"{fmt_bytes(MAX_SSH_CONFIG_BYTES)}", HINT) from None
        raise
    total[0] += len(data)
    for pattern in _includes(data.decode(errors="replace")):
        for included in _expand(pattern):
            _walk(included, [*chain, real], total)


_INCLUDE = re.compile(r"(?i)include(?:[ \t]*=[ \t]*|[ \t]+)(.*)")


def _includes(text: str) -> list[str]:
    """The patterns of every Include line (keyword case-insensitive, `Include x` or `Include=x`, as ssh_config(5))."""
    patterns: list[str] = []
    for line in text.splitlines():
        m = _INCLUDE.fullmatch(line.strip())
        if m is None:
            continue
        try:
            patterns += shlex.split(m.group(1))
        except ValueError:
            continue  # asyncssh reports a line it cannot split itself
    return patterns


def _expand(pattern: str) -> list[Path]:
    path = Path(pattern).expanduser()
    if path.anchor:
        base, rest = Path(path.anchor), str(Path(*path.parts[1:]))
    else:
        base, rest = Path("~", ".ssh").expanduser(), pattern
    try:
        found = sorted(base.glob(rest)) if rest else []
    except (OSError, ValueError):
        return []
    # What asyncssh would open: regular files only (a FIFO it skips, so must we: opening one would hang).
    out = []
    for p in found:
        try:
            if stat.S_ISREG(os.stat(p).st_mode):
                out.append(p)
        except OSError:
            continue
    return out
