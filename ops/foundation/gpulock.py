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
from typing import Any, Iterator

from gpuwarden.ops.foundation import journal, statedir, statefiles
from gpuwarden.ops.foundation.errors import Refused
from gpuwarden.ops.foundation.safetext import printable


def _holder(fd: int, path: Path) -> dict[str, Any]:
    """What the holder wrote into its lock file; {} when that is not a lock record (it only names whom to ask)."""
    try:
        info: dict[str, Any] = statefiles.parse(os.pread(fd, 4096, 0) or b"{}", statefiles.LOCK_INFO, path)
    except (OSError, statedir.StateFileError):
        return {}
    return info


@contextlib.contextmanager
def hold(state_dir: Path, gpus: list[int] | tuple[int, ...], what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the locks of `gpus` (in index order, so two callers cannot deadlock).

    Waits up to `wait_s` for each; then raises Refused naming the holder.
    """
    fds: list[int] = []
    gpus = sorted(set(gpus))
    if not gpus:
        yield
        return
    locks = statedir.open_dir(state_dir, statedir.LOCKS, create=True)
    try:
        for gpu in gpus:
            path = locks.path / f"gpu-{gpu}.lock"
            fd = locks.open(path.name, os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(fd)
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        info = _holder(fd, path)
                        who = printable(info.get("who", "another gpuwarden"))
                        raise Refused(
                            f"GPU {gpu} is locked by {who} (pid {info.get('pid', '?')}) running "
                            f"{printable(info.get('what', 'a playbook'))!r} since {printable(info.get('time', '?'))}",
                            "wait for it to finish, or use --wait SECONDS",
                        ) from None
                    time.sleep(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({
                "pid": os.getpid(), "who": journal.who(),  # the same name the journal gives
                "what": what, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }).encode(), 0)
        locks.close()
        yield
    finally:
        locks.close()
        for fd in fds:
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            os.close(fd)
