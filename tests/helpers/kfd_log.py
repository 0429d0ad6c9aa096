"""A kernel log of one KFD eviction and four engines dying of segfaults in libamdhip64, at fixed times from T0:
shared by the unit and integration tests of the triage KFD ranking.
"""

from __future__ import annotations

import time

T0 = 1796126400.0


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f",{int((t % 1) * 1e6):06d}+00:00"


def kernel_log() -> bytes:
    lines = [f"{stamp(T0 + 9.0)} amdgpu: Evicting PASID 0x8001 queues", f"{stamp(T0 + 9.1)} amdgpu: Restoring PASID 0x8001 queues"]
    for i in range(4):
        lines.append(f"{stamp(T0 + 10 + i * 0.3)} dp{i}[{5000 + i}]: segfault at 8 ip 00007f1c1d3bd5d4 sp "
                     f"00007fff64729c30 error 6 in libamdhip64.so.7[b71c9,7f1c1d300000+3a0000] likely on CPU 1 "
                     "(core 1, socket 0)")
    return ("\n".join(lines) + "\n").encode()
