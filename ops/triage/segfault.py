"""User-space crash lines (segfault, general protection, traps) and their signatures.

A signature is the library plus the offset of the faulting instruction inside it, so the same bug
hit by four processes (different PIDs, different load addresses) is one signature.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# x86 page-fault error code bits, as the kernel prints them after "error".
_PF_PROT, _PF_WRITE, _PF_USER, _PF_RSVD, _PF_INSTR = 1, 2, 4, 8, 16

_SEGV = re.compile(
    r"(?P<comm>[^\[\]]{1,40}?)\[(?P<pid>\d+)\]: segfault at (?P<addr>[0-9a-fA-F]+) "
    r"ip (?P<ip>[0-9a-fA-F]+) sp (?P<sp>[0-9a-fA-F]+) error (?P<err>[0-9a-fA-F]+)"
    r"(?: in (?P<lib>[^\[\s]+)\[(?P<map>[^\]]*)\])?"
    r"(?: likely on CPU (?P<cpu>\d+))?")
_TRAP = re.compile(
    r"traps: (?P<comm>[^\[\]]{1,40}?)\[(?P<pid>\d+)\] (?P<what>general protection fault|trap [\w ]+?|int3)"
    r"\s+ip:(?P<ip>[0-9a-fA-F]+) sp:(?P<sp>[0-9a-fA-F]+) error:(?P<err>[0-9a-fA-F]+)"
    r"(?: in (?P<lib>[^\[\s]+)\[(?P<map>[^\]]*)\])?")
# "[3ca89d,7782cc824000+430000]" (kernels >= 6.1: offset in file, start+size) or "[7f12000+1b000]".
_MAP_NEW = re.compile(r"^(?P<off>[0-9a-fA-F]+),(?P<base>[0-9a-fA-F]+)\+(?P<size>[0-9a-fA-F]+)$")
_MAP_OLD = re.compile(r"^(?P<base>[0-9a-fA-F]+)\+(?P<size>[0-9a-fA-F]+)$")


@dataclass(frozen=True)
class Crash:
    kind: str  # "segfault", "general protection fault", "trap invalid opcode", ...
    process: str
    pid: int
    ip: int
    address: int | None  # faulting data address (segfaults only)
    error: int
    library: str | None
    offset: int | None  # of ip inside the library
    cpu: int | None

    @property
    def signature(self) -> str:
        if self.library and self.offset is not None:
            return f"{self.library}+{self.offset:#x}"
        # No mapping printed (e.g. rate-limited): the best we have is process + ip.
        return f"{self.process}@ip {self.ip:#x}"

    @property
    def signal(self) -> str:
        """The signal the process got for it, as the kernel sends it."""
        if self.kind == "segfault" or self.kind == "general protection fault":
            return "SIGSEGV"
        if "invalid opcode" in self.kind:
            return "SIGILL"
        if "divide" in self.kind:
            return "SIGFPE"
        return "SIGTRAP" if self.kind in ("int3",) or "trap" in self.kind else "SIGSEGV"

    @property
    def where(self) -> str:
        return os.path.basename(self.library) if self.library else "an unmapped address"

    def access(self) -> str:
        """The error code in words, e.g. 'user-mode write to an unmapped page'."""
        if self.kind != "segfault":
            return self.kind
        mode = "user-mode" if self.error & _PF_USER else "kernel-mode"
        op = "instruction fetch" if self.error & _PF_INSTR else ("write" if self.error & _PF_WRITE else "read")
        page = "a protected page" if self.error & _PF_PROT else "an unmapped page"
        text = f"{mode} {op} of {page}"
        if self.address is not None and self.address < 0x1000:
            text += f" (NULL pointer + {self.address:#x})"
        return text


def parse(message: str) -> Crash | None:
    m = _SEGV.search(message)
    kind = "segfault"
    if not m:
        m = _TRAP.search(message)
        if not m:
            return None
        kind = m["what"]
    ip = int(m["ip"], 16)
    library, offset = m["lib"], None
    mapping = m["map"] or ""
    new, old = _MAP_NEW.match(mapping), _MAP_OLD.match(mapping)
    if new:
        offset = int(new["off"], 16)
    elif old:
        offset = ip - int(old["base"], 16)
    if offset is not None and offset < 0:
        offset = None
    addr = m.groupdict().get("addr")
    cpu = m.groupdict().get("cpu")
    return Crash(kind=kind, process=m["comm"].strip(), pid=int(m["pid"]), ip=ip,
                 address=int(addr, 16) if addr else None, error=int(m["err"], 16),
                 library=library, offset=offset, cpu=int(cpu) if cpu else None)
