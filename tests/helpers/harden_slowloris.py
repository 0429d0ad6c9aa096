"""What several test files share with test_harden_slowloris.py: metrics_port.

Taken out of test_harden_slowloris.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations


def metrics_port(agent) -> int | None:
    import re
    m = re.search(r"127\.0\.0\.1:(\d+)", agent.log_text() + getattr(agent, "ready_message", ""))
    return int(m.group(1)) if m and m.group(1) != "0" else None
