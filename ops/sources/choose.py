"""The one place that decides where a snapshot comes from: the node agent, sampling here, or a bundle.

status (text, --json, --watch), the console, metrics and history ask it; what it hands back names itself.

The rules, in order (tests/integration/ops/sources/test_sources_choose.py checks each):
  1. A bundle named by the caller is the source, whatever else answers.
  2. A captured tree (--sysfs-root/--proc-root, a replay) is read here: the agent samples the live node.
     History is the exception: it is the state dir's, whatever roots the command reads.
  3. The agent at <state dir>/agent.sock is the source when it answers 200 and, for a named --backend, says
     (x-gpuwarden-backend) that it samples that one; no answer, another status or another backend: sample here.
  4. Sampling here opens the named or first working backend; only the console falls back to the simulated node
     when none works (ops/node/backends/select.open_for_console); every command says "no GPU backend works".
  5. The agent's bytes go out untouched (`status --json`, raw()) only when nothing must be added to them: a node
     config of the command's own (--config, GPUWARDEN_CONFIG) is checked here, and a problem with it is a warning
     of the source (config-unusable), which the caller shows.

This module imports only the socket client: `status --json` answered by the agent loads nothing more.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.ops.agent import client
from gpuwarden.ops.foundation.paths import AGENT_SOCKET
from gpuwarden.ops.foundation.errors import GpuwardenError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `status --json` comes through here
if TYPE_CHECKING:
    from typing import Protocol

    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.sources.kinds import Source

    class SourceSettings(Protocol):
        """What the chooser reads of the settings: Settings has it; fastcli's cheap stand-in too."""

        @property
        def state_dir(self) -> Path: ...
        @property
        def backend(self) -> str | None: ...
        @property
        def captured(self) -> bool: ...
        @property
        def cli_words(self) -> tuple[str, ...]: ...

# What the caller wants.
ONCE = "once"  # one snapshot: status, status --json
WATCH = "watch"  # one after another until Ctrl-C: status --watch (the agent's while it answers)
CONSOLE = "console"  # the console: the agent's while it answers, else sampled here, else the simulated node
METRICS = "metrics"  # the agent's Prometheus exposition, else one snapshot sampled here
HISTORY = "history"  # the agent's history document; without one the caller reads the state dir's files

# What it chose (Source.kind).
AGENT, LOCAL, BUNDLE, SIMULATED = "agent", "local", "bundle", "simulated"


class SourceWarning:
    """Something the operator should know about the chosen source, as data: a stable `code`, a `message`."""

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str):
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"SourceWarning({self.code!r}, {self.message!r})"

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def agent_socket(settings: SourceSettings) -> Path:
    return Path(settings.state_dir) / AGENT_SOCKET


def agent_reply(settings: SourceSettings, want: str = ONCE, target: str = client.SNAPSHOT) -> client.Reply | None:
    """The agent's 200 reply to `target` when the agent speaks for the node as this command reads it (rules 2-3);
    None when the caller must read the node (or, for HISTORY, the state dir) itself."""
    of_the_node = want != HISTORY
    if of_the_node and settings.captured:
        return None  # a captured tree: the agent samples the live node (the host's roots under a mount are live)
    reply = client.get(agent_socket(settings), target)
    if reply is None or reply.status != 200:
        return None  # no agent, or it refused (starting, overloaded): sample here
    if of_the_node and settings.backend and settings.backend != "auto" \
            and reply.headers.get("x-gpuwarden-backend") != settings.backend:
        return None  # --backend names another source than the agent's: sample that one here
    return reply


def names_own_config(settings: SourceSettings) -> bool:
    """True when this command was given a node config of its own (the agent read its own)."""
    return "--config" in settings.cli_words or bool(os.environ.get("GPUWARDEN_CONFIG"))


def raw(settings: SourceSettings) -> client.Reply | None:
    """`status --json`'s cheap path: the agent's snapshot reply, to be written out untouched (rule 5); None when
    the caller must take choose(): no agent speaks for this node, or a config of the command's own needs checking."""
    if names_own_config(settings):
        return None
    return agent_reply(settings, ONCE)


def reply_exit_code(reply: client.Reply) -> int:
    """status's exit status for an agent's snapshot reply: 1 when it needs attention or its data is stale."""
    attention = reply.headers.get("x-gpuwarden-needs-attention") == "1"
    return 1 if attention or reply.headers.get("x-gpuwarden-stale") == "1" else 0


def own_config_warning(settings: Settings) -> SourceWarning | None:
    """Rule 5: a node config given to this command that does not load, as a sampled status would say it; None
    when none was given, there is no such file (no file is no config), or it loads."""
    if not names_own_config(settings) or not settings.config_path.exists():
        return None
    # only with a config file of the command's own (typing, tomllib)
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (25.1 ms there)
    from gpuwarden.ops.config import nodeconfig
    try:
        nodeconfig.load(settings)
    except GpuwardenError as exc:
        return SourceWarning("config-unusable", f"node config unusable, arena and launch settings ignored: "
                                                f"{exc.message} (see `gpuwarden config check`)")
    return None


def choose(settings: Settings, want: str = ONCE, *, bundle: Path | None = None,
           target: str = client.SNAPSHOT) -> Source:
    """The source for `want` (rules 1-4): call it (or .snapshot()) for NodeSnapshots, .close() when done; .kind
    and .describe() say which it is, .warnings what the caller should show beside it. `target` is the agent's
    document for METRICS (its /metrics with the caller's query). A local backend that cannot open raises here."""
    if want == HISTORY:
        raise ValueError("history has no snapshot source: use agent_reply(settings, HISTORY, target)")
    # raw() answers `status --json` without the data model or the sampler
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (7.2 ms there)
    from gpuwarden.ops.sources import kinds
    if bundle is not None:
        return kinds.BundleSource(settings, bundle)
    if want == CONSOLE:
        return kinds.ConsoleSource(settings)
    reply = agent_reply(settings, want, target if want == METRICS else client.SNAPSHOT)
    if reply is not None:
        return kinds.AgentSource(settings, reply)
    return kinds.LocalSource(settings, use_pidfds=want == WATCH)
