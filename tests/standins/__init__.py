"""Stand-ins for vendor libraries that cannot run here (no AMD or NVIDIA GPU), built from the real
APIs' signatures and replaying captured real outputs from tests/fixtures.
"""
