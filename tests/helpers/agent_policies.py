"""What several test files share with test_agent_policies.py: kmsg_records.

Taken out of test_agent_policies.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import re


def kmsg_records(fixture_text: str, first_seq: int = 100) -> list[str]:
    """A captured dmesg -T excerpt as the /dev/kmsg records the kernel would have given (level err)."""
    out = []
    for i, line in enumerate(fixture_text.splitlines()):
        msg = re.sub(r"^\[[^\]]*\]\s?", "", line)
        out.append(f"3,{first_seq + i},{(1000 + i) * 1000},-;{msg}")
        out.append(" SUBSYSTEM=pci")  # a record's dictionary line, as the kernel appends it
    return out
