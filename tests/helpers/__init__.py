"""What many test files need, one copy each: free loopback ports, the journal as records.

Fixtures stay in conftest.py (one per meaning); plain functions live here, imported as `from helpers.x import y`.
"""
