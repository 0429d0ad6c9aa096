"""Triage ranks the KFD system-memory entry first with the node's numbers, or says which context it needs.

The arena incident as a bundle: four engines registered 25 GiB each of a 121.55 GiB limit, dp2's hipHostMalloc of
8 GiB failed 0.3 s before the first of four same-offset libamdhip64 segfaults, after KFD evict/restore lines.
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


def test_a_bare_dmesg_through_the_cli_says_which_context_it_needs(cli, tmp_path):
    log = tmp_path / "dmesg.log"
    log.write_bytes(kernel_log())
    out = cli("triage", str(log))
    assert "to rank it, triage needs" in out.stdout, out.stdout
    assert "`kfd-system-mem-limit-pinned-after-registration`" in out.stdout and "sudo gpuwarden bundle" in out.stdout
