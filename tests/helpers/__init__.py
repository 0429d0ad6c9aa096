"""What several test files need, one copy each: the simulated node's tenants, agents, sysfs trees, stand-in
clusters and servers, the paths of the checkout; imported as `from helpers.x import y`.

Test files never import one another: what two of them share moves here. Fixtures used across the suite stay in
conftest.py (one per meaning); a fixture only a few files take lives in the helper they import it from.
"""
