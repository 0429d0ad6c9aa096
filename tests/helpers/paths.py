"""Where the checkout, the tests and the captured fixtures are, for every test file and helper.

Test files sit at different depths (tests/unit/ops/agent/...): they take these instead of counting parents.
"""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"  # captured public outputs; provenance in its SOURCES.md
