"""Per-GPU locks (flock) so two operators' playbooks on one GPU never interleave.

A lock file also records its holder (pid, who, what) so the loser can be told whom to ask.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator

from . import journal, statedir
from .errors import Refused


def _lock_path(state_dir: Path, gpu: int) -> Path:
    return statedir.ensure(state_dir, statedir.LOCKS) / f"gpu-{gpu}.lock"


@contextlib.contextmanager
def hold(state_dir: Path, gpus: list[int] | tuple[int, ...], what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the locks of `gpus` (in index order, so two callers cannot deadlock).

    Waits up to `wait_s` for each; then raises Refused naming the holder.
    """
    fds: list[int] = []
    try:
        for gpu in sorted(set(gpus)):
            path = _lock_path(state_dir, gpu)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(fd)
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        info = {}
                        try:
                            info = json.loads(path.read_text() or "{}")
                        except (OSError, json.JSONDecodeError):
                            pass
                        who = info.get("who", "another gpuwarden")
                        raise Refused(
                            f"GPU {gpu} is locked by {who} (pid {info.get('pid', '?')}) running "
                            f"{info.get('what', 'a playbook')!r} since {info.get('time', '?')}",
                            "wait for it to finish, or use --wait SECONDS",
                        ) from None
                    time.sleep(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({
                "pid": os.getpid(), "who": journal.who(),  # the same name the journal gives
                "what": what, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }).encode(), 0)
        yield
    finally:
        for fd in fds:
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            os.close(fd)
