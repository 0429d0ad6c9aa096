"""Triage ranks the KFD system-memory entry first with the node's numbers, or says which context it needs.

The arena incident as a bundle: four engines registered 25 GiB each of a 121.55 GiB limit, dp2's hipHostMalloc of
8 GiB failed 0.3 s before the first of four same-offset libamdhip64 segfaults, after KFD evict/restore lines.
"""

from __future__ import annotations

from helpers.kfd_log import kernel_log


def test_a_bare_dmesg_through_the_cli_says_which_context_it_needs(cli, tmp_path):
    log = tmp_path / "dmesg.log"
    log.write_bytes(kernel_log())
    out = cli("triage", str(log))
    assert "to rank it, triage needs" in out.stdout, out.stdout
    assert "`kfd-system-mem-limit-pinned-after-registration`" in out.stdout and "sudo gpuwarden bundle" in out.stdout
