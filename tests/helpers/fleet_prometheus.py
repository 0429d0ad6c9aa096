"""What several test files share with test_fleet_prometheus.py: start_exporting_agent.

Taken out of test_fleet_prometheus.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import re
from helpers.agentnode import start_agent
from helpers.simnode import wait_for


def start_exporting_agent(node, interval: str = "0.5"):
    """A real agent on the node's state dir serving /metrics on a free loopback port; (agent, its address)."""
    agent = start_agent(node.state_dir, interval=interval,
                        env={"GPUWARDEN_METRICS_LISTEN": "127.0.0.1:0",
                             "GPUWARDEN_CONFIG": str(node.home / "node.toml")})
    listen = wait_for(lambda: re.search(r"metrics on http://(127\.0\.0\.1:\d+)/metrics", agent.log_text()),
                      what=f"{node.name}'s metrics listener")[1]
    return agent, listen
