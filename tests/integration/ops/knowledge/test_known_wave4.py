"""The catalog entries added in wave 4 (after the `# --- added in wave 4 ---` line of known_issues.toml): every
claim they make is located in a source (URL, locator, date checked, what is there) or marked as gpuwarden's own
reasoning, the catalog holds 70 or more entries, and the loader refuses evidence it could not show to an operator.
"""

from __future__ import annotations





def test_known_shows_where_each_claim_comes_from_and_what_is_own_reasoning(cli):
    proc = cli("known", "kfd-svm-exceeds-resident-limit")
    # Each claim's sources stand under it (the audit's display): URL, then the locator and the date checked.
    assert proc.returncode == 0
    said = proc.stdout.split("What upstream said:")[1].split("Workaround:")[0]
    assert "- https://github.com/ROCm/ROCm/issues/6582 (comment by nkulshre-amd, 2026-08-28" in said
    proc = cli("known", "myth-kfd-memory-policy")
    instead = proc.stdout.split("Workaround:")[1]
    assert "gpuwarden's own reasoning" in instead.split("\n\n")[0]
