"""Where the doctor reads: the node's roots, one cache the checks share, and a reader per check that records its reads.

Paths are shown as on the node (/sys/..., /etc/...), whatever tree they were read from; `Roots.where` says which.
"""

from __future__ import annotations

import builtins
import os
import re
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node.sim.node import active_sim_root

# root name -> the path it stands for on a node
LOGICAL = {"sys": "/sys", "gpu": "/sys", "proc": "/proc", "etc": "/etc", "boot": "/boot", "opt": "/opt"}
READ_LIMIT = 1 << 20
T = TypeVar("T")

_SHOWN_AS = ((re.compile(r"/card\d+/"), "/card*/"), (re.compile(r"/nodes/\d+/"), "/nodes/*/"),
             (re.compile(r"^/proc/\d+/"), "/proc/<pid>/"), (re.compile(r"/io_links/\d+/"), "/io_links/*/"),
             (re.compile(r"/iommu_groups/\d+/"), "/iommu_groups/*/"))


@dataclass(frozen=True)
class Roots:
    """`gpu` is the tree the GPU backend reads (the simulated node's on a sim node); `sys` is the host's /sys."""

    sys: Path
    gpu: Path
    proc: Path
    etc: Path
    boot: Path
    opt: Path
    simulated: bool = False

    @classmethod
    def of(cls, settings: Settings) -> "Roots":
        sim = active_sim_root(settings)
        return cls(sys=settings.sysfs_root, gpu=sim or settings.sysfs_root, proc=settings.proc_root,
                   etc=settings.etc_root, boot=settings.boot_root, opt=settings.opt_root, simulated=sim is not None)

    def where(self) -> dict[str, str]:
        return {name: str(getattr(self, name)) for name in LOGICAL}


class Probe:
    """What every check of one doctor run shares: settings, roots, and values computed once (GPU list, NVML)."""

    def __init__(self, settings: Settings, roots: Roots | None = None, *, live: bool | None = None,
                 extra: dict[str, Any] | None = None):
        self.settings = settings
        self.roots = roots or Roots.of(settings)
        self.live = settings.live if live is None else live
        # Facts a bundle recorded that no tree holds (e.g. the collector's RLIMIT_MEMLOCK); empty when live.
        self.extra = extra or {}
        self._lock = threading.Lock()
        self._cache: dict[str, Future[Any]] = {}

    def shared(self, key: str, fn: Callable[[], T]) -> T:
        """fn() computed once per run, by the first check that asks; the others wait for that answer."""
        with self._lock:
            fut = self._cache.get(key)
            owner = fut is None
            if fut is None:
                fut = self._cache[key] = Future()
        if owner:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to every caller, who each turn it into their verdict
                fut.set_exception(exc)
        value: T = fut.result()  # a key always comes with the same fn, so its answer has fn's type
        return value


class CheckIO:
    """One check's view of the node: every file it reads is recorded, as the node would name it."""

    def __init__(self, probe: Probe):
        self.probe = probe
        self.settings = probe.settings
        self.roots = probe.roots
        self.live = probe.live
        self.reads: list[str] = []

    # --- recording -------------------------------------------------------------------------------
    def note(self, what: str) -> None:
        """Record a read that is not a file (a library call, getrlimit, a socket)."""
        for pattern, repl in _SHOWN_AS:
            what = pattern.sub(repl, what)
        if what not in self.reads:
            self.reads.append(what)

    def path(self, root: str, rel: str, *, record: bool = True) -> Path:
        rel = rel.lstrip("/")
        if record:
            self.note(f"{LOGICAL[root]}/{rel}" if root in LOGICAL else rel)
        return Path(getattr(self.roots, root)) / rel

    # --- reading ---------------------------------------------------------------------------------
    def text(self, root: str, rel: str) -> str | None:
        data = self.bytes(root, rel, READ_LIMIT)
        return data.decode(errors="replace") if data is not None else None

    def line(self, root: str, rel: str) -> str | None:
        text = self.text(root, rel)
        return text.strip() if text is not None else None

    def int(self, root: str, rel: str) -> int | None:
        text = self.line(root, rel)
        try:
            return int(text.split()[0], 0) if text else None
        except (ValueError, IndexError):
            return None

    # builtins.: the methods int and bytes above and here shadow the builtin names inside this class
    def bytes(self, root: str, rel: str, limit: builtins.int = 4096) -> builtins.bytes | None:
        try:
            # O_NONBLOCK: a FIFO planted in a captured or simulated tree must not hang a check.
            fd = os.open(self.path(root, rel), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            chunks, size = [], 0
            while size < limit:  # /proc files hand out a page or so per read
                chunk = os.read(fd, limit - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def listdir(self, root: str, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(root, rel, record=False)))
        except OSError:
            return []

    def exists(self, root: str, rel: str) -> bool:
        return os.path.exists(self.path(root, rel))

    def shared(self, key: str, fn: Callable[[], T]) -> T:
        return self.probe.shared(key, fn)
