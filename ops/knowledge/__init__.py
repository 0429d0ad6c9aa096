"""Known issues as data: a catalog of upstream bugs and limits (known_issues.toml), and what matches a report.

catalog.py loads and checks the TOML; match.py says which entries a triage report's findings fit, with the
node's versions where they are known. triage, doctor, `report` and `gpuwarden known` cite it.
"""

from gpuwarden.ops.knowledge.catalog import Catalog, Entry, load
from gpuwarden.ops.knowledge.match import Match, cite, match_findings

__all__ = ["Catalog", "Entry", "load", "Match", "cite", "match_findings"]
