"""What several test files share with test_metrics_rules.py: DASHBOARD, RULES.

Taken out of test_metrics_rules.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

from helpers.paths import REPO


RULES = REPO / "deploy" / "prometheus" / "gpuwarden-rules.yml"


DASHBOARD = REPO / "deploy" / "grafana" / "gpuwarden.json"
