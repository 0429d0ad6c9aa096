"""The sources ops/sources/choose.py hands back: the agent's snapshots, a Sampler here, a bundle's captured node
and the console's agent-else-here. Each is called for a NodeSnapshot, says what it is, and is closed after use.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuwarden.ops.agent import client
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import NodeSnapshot, snapshot_from_dict
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.sources.choose import (AGENT, BUNDLE, LOCAL, SIMULATED, SourceWarning, agent_reply, agent_socket,
                                          own_config_warning)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms): status loads this module
if TYPE_CHECKING:
    from typing import Any, Protocol

    from gpuwarden.ops.sampling.sampler import Sampler
    from gpuwarden.ops.sources.choose import SourceSettings

    class Source(Protocol):
        """What every source offers its viewer."""

        @property
        def kind(self) -> str: ...  # AGENT, LOCAL, BUNDLE or SIMULATED (choose.py)

        def __call__(self) -> NodeSnapshot: ...
        def snapshot(self, deep: bool | None = None) -> NodeSnapshot: ...
        def describe(self) -> str: ...
        @property
        def warnings(self) -> tuple[SourceWarning, ...]: ...
        def close(self) -> None: ...


class AgentSource:
    """The agent's snapshots: its first reply (the chooser's), then one request per call; an agent that stops
    answering is an error (a watch says so rather than switching silently to another source)."""

    kind = AGENT

    def __init__(self, settings: SourceSettings, reply: client.Reply):
        self.settings = settings
        self.socket = agent_socket(settings)
        self.reply = reply  # the latest reply: its bytes and headers for `status --json`, `metrics`
        self._unread: client.Reply | None = reply
        self._warnings: tuple[SourceWarning, ...] | None = None

    def describe(self) -> str:
        return f"agent at {self.socket}"

    @property
    def warnings(self) -> tuple[SourceWarning, ...]:
        if self._warnings is None:  # checked once, when asked: gpu-check and metrics never ask
            problem = own_config_warning(self.settings) if isinstance(self.settings, Settings) else None
            self._warnings = (problem,) if problem is not None else ()
        return self._warnings

    def snapshot(self, deep: bool | None = None) -> NodeSnapshot:
        reply, self._unread = self._unread, None
        if reply is None:
            reply = client.get(self.socket, client.SNAPSHOT)
            if reply is None or reply.status != 200:
                raise GpuwardenError("the agent stopped answering", "run `gpuwarden status` again to sample here")
            self.reply = reply
        return snapshot_from_dict(reply.json())

    __call__ = snapshot

    def close(self) -> None:
        pass


class LocalSource:
    """A Sampler of our own on the named or first working backend; for the console (`console=True`), the simulated
    node when none works, labelled with why."""

    def __init__(self, settings: Settings, *, use_pidfds: bool = True, console: bool = False):
        # deferred: `gpuwarden status` answered by the agent (text too) loads neither the sampler nor a backend
        from gpuwarden.ops.node.backends.select import open_backend, open_for_console
        # deferred: keeps `gpuwarden status --help` cheap (4.8 ms there)
        from gpuwarden.ops.sampling.sampler import Sampler
        backend = open_for_console(settings) if console else open_backend(settings)
        self.sampler: Sampler = Sampler(settings, backend, use_pidfds=use_pidfds)  # opened now: a missing library fails here
        if console:
            # Between full scans a deep scan reads /proc/<pid>/fd only of new processes and known holders: every
            # process's fds each 10 s was a sixth of an idle console's CPU on an H100 (issue 38). What waits up to
            # CONSOLE_FULL_SCAN_S is a process first seen without a GPU file that opens one later and allocates
            # nothing (one that allocates is listed by KFD or NVML at once).
            self.sampler.full_scan_every_s = CONSOLE_FULL_SCAN_S
        self.fallback_reason: str | None = getattr(backend, "fallback_reason", None)
        self.kind = SIMULATED if self.fallback_reason else LOCAL

    def describe(self) -> str:
        if self.fallback_reason:
            return f"simulated node ({self.fallback_reason})"
        return f"local {self.sampler.backend.name}"

    @property
    def warnings(self) -> tuple[SourceWarning, ...]:
        return ()  # a sampled snapshot carries its own (stale reads, SIMULATED)

    def snapshot(self, deep: bool | None = None) -> NodeSnapshot:
        return self.sampler.snapshot(deep=deep)

    def show_process_gpu(self, shown: bool) -> None:
        """Whether a view shows per-process GPU% (NVML asks it per GPU with processes; hidden, it is not asked)."""
        self.sampler.process_gpu = shown

    def __call__(self) -> NodeSnapshot:
        return self.sampler.snapshot()

    def close(self) -> None:
        self.sampler.close()


class BundleSource:
    """The node an incident bundle captured; the same snapshot every call."""

    kind = BUNDLE

    def __init__(self, settings: Settings, path: Path):
        # only a bundle's viewer reads one (tarfile); status and the console go without
        # deferred: keeps `gpuwarden status --json` cheap (15.0 ms there)
        from gpuwarden.ops.bundle.replay import snapshot_from_bundle
        self.path = Path(path)
        self._snap = snapshot_from_bundle(self.path, settings)

    def describe(self) -> str:
        return f"bundle {self.path}"

    @property
    def warnings(self) -> tuple[SourceWarning, ...]:
        return ()

    def snapshot(self, deep: bool | None = None) -> NodeSnapshot:
        return self._snap

    def __call__(self) -> NodeSnapshot:
        return self._snap

    def close(self) -> None:
        pass


# The console's local sampler: every process's /proc/<pid>/fd read at most this often (the agent's default: 300 s).
CONSOLE_FULL_SCAN_S = 60.0
# While no agent answered, the console asks again at most this often: a started agent is taken within that.
AGENT_RETRY_S = 5.0


class ConsoleSource:
    """The console's: the agent's snapshots while it answers, a Sampler of our own while it does not.

    Many consoles over SSH then share the agent's one sampler; a stopped agent costs a refresh, not the view.
    The local sampler opens at once when no agent answers now, so a missing GPU library fails before the screen.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.socket = agent_socket(settings)
        self._local: LocalSource | None = None
        self.via_agent = False
        self._agent_missed_at: float | None = None  # monotonic time of the last ask no agent answered
        self._process_gpu = True
        if self._from_agent() is None:
            self._agent_missed_at = time.monotonic()
            self._local = LocalSource(settings, console=True)

    @property
    def kind(self) -> str:
        if self.via_agent or self._local is None:
            return AGENT
        return self._local.kind

    def describe(self) -> str:
        if self.via_agent or self._local is None:
            return f"agent at {self.socket}"
        return self._local.describe()

    @property
    def warnings(self) -> tuple[SourceWarning, ...]:
        return ()

    def _from_agent(self) -> NodeSnapshot | None:
        reply = agent_reply(self.settings)
        return snapshot_from_dict(reply.json()) if reply is not None else None

    def snapshot(self, deep: bool | None = None) -> NodeSnapshot:
        missed = self._agent_missed_at
        if missed is not None and self._local is not None and time.monotonic() - missed < AGENT_RETRY_S:
            return self._local.snapshot(deep)  # no agent a moment ago: not asked again every refresh
        snap = self._from_agent()
        self._agent_missed_at = None if snap is not None else time.monotonic()
        self.via_agent = snap is not None
        if snap is not None:
            return snap
        if self._local is None:
            self._local = LocalSource(self.settings, console=True)
            self._local.show_process_gpu(self._process_gpu)
        return self._local.snapshot(deep)

    def __call__(self) -> NodeSnapshot:
        return self.snapshot()

    def show_process_gpu(self, shown: bool) -> None:
        self._process_gpu = shown
        if self._local is not None:
            self._local.show_process_gpu(shown)

    def agent_json(self, target: str) -> dict[str, Any] | None:
        """Another document from the agent (history, events), for a viewer's backfill; None without one."""
        reply = client.get(self.socket, target)
        return reply.json() if reply is not None and reply.status == 200 else None

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
