"""The unit tier's rule, checked as it runs: no child process, no socket, no server. A test that needs one
belongs in tests/integration (the same part folder), where the fixtures that start them are used.
"""

from __future__ import annotations

import os
import socket
import subprocess
from contextlib import contextmanager

import pytest

_PROCESS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve")
_SOCKET = ("connect", "connect_ex", "bind", "listen")


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"a unit test {what}: move its file to tests/integration/ (the tier's rule in "
                             "tests/README.md), or give the code under test a seam that needs neither")
    return refused


@contextmanager
def _no_processes_or_sockets():
    """subprocess, fork and exec, and socket connect/bind/listen fail loudly (a socketpair, which asyncio's event
    loop makes for itself, is allowed: it never leaves the process)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "__init__", _refuse("started a process"))
        for name in _PROCESS:
            if hasattr(os, name):
                mp.setattr(os, name, _refuse("started a process"))
        for name in _SOCKET:
            mp.setattr(socket.socket, name, _refuse("opened a socket"))
        yield


# Around each unit test's setup (its fixtures of every scope that it is the first to need) and its call; not its
# teardown, where the session's fixtures an integration file started may be stopped when both tiers run together.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _no_processes_or_sockets():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _no_processes_or_sockets():
        return (yield)
