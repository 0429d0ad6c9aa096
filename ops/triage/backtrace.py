"""Read a core dump's backtrace as eu-stack, gdb or coredumpctl printed it: frames with function, module, offset.

The bundle runs the tool (ops/bundle/cores.py); triage only parses what it stored, so a bundle from a
node with gdb/eu-stack triages the same anywhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# eu-stack -m -b: "#0  0x00007f1b808990f9 boom_register - libboom.so.7" then "    [build-id]@0x7f..+0x10f9"
_EU = re.compile(r"^#(?P<n>\d+)\s+0x(?P<pc>[0-9a-f]+)\s+(?P<func>\S{1,200}?|\?\?)?(?: - (?P<module>\S{1,300}))?\s*$")
_EU_OFF = re.compile(r"^\s+\[[0-9a-f]{0,64}\]@0x[0-9a-f]+\+0x(?P<off>[0-9a-f]+)")
# gdb: "#0  0x00007f... in boom_register () from ./libboom.so.7" / "#1  0x... in main () at x.c:3"
_GDB = re.compile(r"^#(?P<n>\d+)\s+(?:0x(?P<pc>[0-9a-f]+) in )?(?P<func>[^\s(]{1,200}|\?\?) \([^)\n]{0,400}\)"
                  r"(?: from (?P<module>\S{1,300}))?(?: at (?P<src>\S{1,300}))?")
# coredumpctl info: "#0  0x00007f3d56e45970 n/a (libhsa-runtime64.so.1 + 0x45970)"
_CORECTL = re.compile(r"^\s*#(?P<n>\d+)\s+0x(?P<pc>[0-9a-f]+)\s+(?P<func>\S{1,200})\s+\((?P<module>[^\s+)]{1,300})"
                      r"(?: \+ 0x(?P<off>[0-9a-f]+))?\)")
_LIBC = ("libc.so", "libpthread.so", "libc-", "ld-linux", "libgcc_s.so", "libstdc++.so")


@dataclass
class Frame:
    index: int
    function: str | None
    module: str | None
    offset: str | None  # within the module, hex with 0x

    def where(self) -> str:
        mod = os.path.basename(self.module) if self.module else "an unknown module"
        out = mod + (f" at offset {self.offset}" if self.offset else "")
        return out + (f" ({self.function})" if self.function and self.function not in ("??", "n/a") else "")


def parse(text: str, max_frames: int = 64) -> list[Frame]:
    """The first thread's frames (the crashing thread comes first in all three tools)."""
    frames: list[Frame] = []
    for raw in text.splitlines():
        m = _EU_OFF.match(raw)
        if m and frames and frames[-1].offset is None:
            frames[-1].offset = f"0x{m['off']}"
            continue
        line = raw.rstrip()
        m = _CORECTL.match(line) or _EU.match(line.strip()) or _GDB.match(line.strip())
        if not m:
            continue
        n = int(m["n"])
        if n == 0 and frames:
            if len(frames) > 1:
                break  # the next thread
            frames = []  # gdb prints the crash frame once on loading the core, then the whole trace
        g = m.groupdict()
        func = g.get("func")
        frames.append(Frame(n, None if func in (None, "??", "n/a") else func, g.get("module"),
                            f"0x{g['off']}" if g.get("off") else None))
        if len(frames) >= max_frames:
            break
    return frames


def crash_frame(frames: list[Frame]) -> Frame | None:
    """The frame to name: the top one, past signal plumbing in libc (raise/abort) when there is more."""
    for f in frames:
        if f.module and os.path.basename(f.module).startswith(_LIBC) and f is not frames[-1]:
            continue
        return f
    return frames[0] if frames else None
