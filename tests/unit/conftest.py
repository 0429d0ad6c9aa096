"""The unit tier's rule, checked as it runs: no child process, no socket, no server; a test that needs one
belongs in tests/integration (same part folder), where the fixtures that start them are used.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"a unit test {what}: move its file to tests/integration/ (the tier's rule in "
                             "tests/README.md), or give the code under test a seam that needs neither")
    return refused


@pytest.fixture(autouse=True)
def _no_processes_or_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """subprocess, fork and exec, and socket connect/bind/listen fail loudly inside a unit test (a socketpair,
    which asyncio's event loop makes for itself, is not refused: it never leaves the process)."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a process"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse("started a process"))
    for name in ("connect", "connect_ex", "bind", "listen"):
        monkeypatch.setattr(socket.socket, name, _refuse("opened a socket"))
