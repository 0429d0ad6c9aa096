"""The node config (TOML): the arena, the engines to supervise, the stagger policy, the state dir.

`load(settings)` parses and validates it; every error names the file, the line and the key.
"""

from __future__ import annotations

import re
import signal
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .agent.config import DEFAULT as AGENT_DEFAULTS
from .agent.config import AgentConfig
from .agent.config import parse as parse_agent
from .errors import ConfigError, GpuwardenError
from .settings import Settings
from .units import parse_size

PROGRESS_KINDS = ("status", "log", "preload")
RESTART_POLICIES = ("no", "on-failure")
DEFAULT_LOG_MAX = 16 << 20
DEFAULT_REGISTRATION_TIMEOUT = 600.0
DEFAULT_REGISTER_THRESHOLD = 256 << 20
GATE_RELEASE_RE = re.compile(r"^(registered|ready|(\d+(\.\d+)?)s)$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

# Keys each table accepts; anything else is a typo worth stopping for.
_TOP_KEYS = {"state_dir", "arena", "stagger", "engines", "defaults", "agent"}
_ARENA_KEYS = {"path", "size", "source"}
_STAGGER_KEYS = {"slots", "registration_timeout"}
_ENGINE_KEYS = {
    "name", "argv", "gpu", "env", "workdir", "progress", "registered_pattern", "ready_pattern",
    "stop_signal", "stop_grace", "restart", "restart_backoff", "restart_backoff_max",
    "start_limit_burst", "start_limit_interval", "log_max", "gated",
    "gate_release", "register_threshold",
}
# Keys that make sense once per node, so [defaults] may not set them.
_PER_ENGINE_ONLY = {"name", "gpu"}


@dataclass(frozen=True)
class ArenaConfig:
    path: str
    size: int | None = None
    source: str | None = None


@dataclass(frozen=True)
class StaggerConfig:
    slots: int = 1
    registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT


@dataclass(frozen=True)
class EngineConfig:
    """One engine as the shim runs it; plain data, so it round-trips through spec.json."""

    name: str
    argv: tuple[str, ...]
    gpu: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    # "status": the engine speaks the status protocol; "log": follow patterns; "preload": the
    # interposer (native/) gates and reports its register calls, ready_pattern says when it serves
    progress: str = "status"
    registered_pattern: str | None = None
    ready_pattern: str | None = None
    stop_signal: str = "SIGTERM"
    stop_grace: float = 30.0
    restart: str = "no"
    restart_backoff: float = 1.0
    restart_backoff_max: float = 60.0
    start_limit_burst: int = 5
    start_limit_interval: float = 300.0
    log_max: int = DEFAULT_LOG_MAX
    gated: bool = True  # take part in the registration gate
    gate_release: str = "registered"  # or "ready", or "<N>s" after registered (preload and log engines)
    register_threshold: int = DEFAULT_REGISTER_THRESHOLD  # preload: smaller registrations pass ungated

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineConfig":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["argv"] = tuple(known.get("argv", ()))
        return cls(**known)


@dataclass(frozen=True)
class NodeConfig:
    path: Path
    engines: tuple[EngineConfig, ...]
    arena: ArenaConfig | None = None
    stagger: StaggerConfig = StaggerConfig()
    state_dir: Path | None = None
    agent: AgentConfig = AGENT_DEFAULTS  # the [agent] table (ops.agent.config)

    def engine(self, name: str) -> EngineConfig | None:
        return next((e for e in self.engines if e.name == name), None)


def load(settings: Settings) -> NodeConfig:
    """Read and validate settings.config_path; raise ConfigError naming file, line and key."""
    path = settings.config_path
    # A sampler asks on every refresh through its FileCache, which calls this only when the file changed.
    try:
        text = path.read_text(encoding="utf-8")  # TOML is UTF-8 whatever the locale
    except FileNotFoundError:
        raise ConfigError(
            f"node config {path} does not exist",
            "write one (`gpuwarden config example` prints a start) or pass --config PATH",
        ) from None
    except PermissionError:
        raise ConfigError(f"no permission to read the node config {path}",
                          "run as a user that can read it, or pass --config PATH") from None
    except IsADirectoryError:
        raise ConfigError(f"node config {path} is a directory", "pass the TOML file itself") from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not valid TOML (not UTF-8 text: byte 0x{exc.object[exc.start]:02x})",
                          "save the file as UTF-8; is it the node config at all?") from None
    return parse(text, path)


def parse(text: str, path: Path) -> NodeConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(exc, text, path) from None
    return _Validator(text, path).node(data)


def _syntax_error(exc: tomllib.TOMLDecodeError, text: str, path: Path) -> ConfigError:
    # Python 3.14 gives lineno/msg; older tomllib only appends "(at line L, column C)" to the message.
    msg = getattr(exc, "msg", None) or str(exc)
    line = getattr(exc, "lineno", None)
    found = re.search(r"\(at line (\d+), column \d+\)$", str(exc))
    if line is None and found:
        line = int(found.group(1))
    msg = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)$", "", msg)
    if line is None:
        line = text.count("\n") + 1
    source = text.splitlines()[line - 1].strip() if 0 < line <= len(text.splitlines()) else ""
    shown = f": {source!r}" if source else ""
    return ConfigError(
        f"{path}:{line}: not valid TOML ({msg.lower()}){shown}",
        "fix that line; strings need quotes, lists are [\"a\", \"b\"], tables are [name] on a line of their own",
    )


class _Validator:
    """Checks parsed data, finding the line of each offending key in the source text."""

    def __init__(self, text: str, path: Path):
        self.lines = text.splitlines()
        self.path = path

    # --- locating keys ---------------------------------------------------------------------

    def line_of(self, table: str | None, index: int | None, key: str | None) -> int:
        """1-based line of `key` inside [table] (or the index-th [[table]]); the header when no key."""
        header_line = 1
        current: str | None = None
        seen = -1
        in_target = table is None
        for n, raw in enumerate(self.lines, 1):
            stripped = raw.strip()
            head = re.match(r"^\[\[\s*([^\]]+?)\s*\]\]|^\[\s*([^\]]+?)\s*\]", stripped)
            if head:
                current = (head.group(1) or head.group(2)).strip()
                if current == table:
                    seen += 1
                    in_target = index is None or seen == index
                    if in_target:
                        header_line = n
                else:
                    in_target = False
                continue
            if in_target and key is not None:
                if re.match(rf"^\s*\"?{re.escape(key)}\"?\s*=", raw):
                    return n
        if table is None and key is not None:
            return 1
        return header_line

    def fail(self, table: str | None, index: int | None, key: str | None, problem: str,
             hint: str) -> ConfigError:
        line = self.line_of(table, index, key)
        where = key if table is None else (f"{table}[{index}].{key}" if index is not None else f"{table}.{key}")
        if key is None:
            where = table if index is None else f"{table}[{index}]"
        return ConfigError(f"{self.path}:{line}: {where}: {problem}", hint)

    # --- the tables ------------------------------------------------------------------------

    def node(self, data: dict[str, Any]) -> NodeConfig:
        for key in data:
            if key not in _TOP_KEYS:
                raise self.fail(None, None, key, "unknown key",
                                f"the top level takes {', '.join(sorted(_TOP_KEYS))}")
        state_dir = data.get("state_dir")
        if state_dir is not None and not isinstance(state_dir, str):
            raise self.fail(None, None, "state_dir", "must be a path string", 'e.g. state_dir = "/run/gpuwarden"')
        arena = self.arena(data["arena"]) if "arena" in data else None
        stagger = self.stagger(data.get("stagger", {}))
        defaults = data.get("defaults", {})
        if not isinstance(defaults, dict):
            raise self.fail(None, None, "defaults", "must be a table", "write [defaults] with engine keys under it")
        for key in defaults:
            if key not in _ENGINE_KEYS or key in _PER_ENGINE_ONLY:
                raise self.fail("defaults", None, key, "not a key [defaults] can set",
                                f"[defaults] takes engine keys except {', '.join(sorted(_PER_ENGINE_ONLY))}")
        raw_engines = data.get("engines", [])
        if not isinstance(raw_engines, list):
            raise self.fail(None, None, "engines", "must be an array of tables",
                            "write each engine as [[engines]] followed by its keys")
        engines = []
        for i, raw in enumerate(raw_engines):
            engines.append(self.engine(i, {**defaults, **raw}, set(raw)))
        names: dict[str, int] = {}
        for i, e in enumerate(engines):
            if e.name in names:
                raise self.fail("engines", i, "name", f"engine name {e.name!r} is used twice",
                                "give every engine its own name")
            names[e.name] = i
        agent = AGENT_DEFAULTS
        if "agent" in data:
            agent = parse_agent(data["agent"], lambda key, problem, hint: self.fail(
                None if not key else "agent", None, key or "agent", problem, hint))
        return NodeConfig(path=self.path, engines=tuple(engines), arena=arena, stagger=stagger,
                          state_dir=Path(state_dir) if state_dir else None, agent=agent)

    def arena(self, raw: Any) -> ArenaConfig:
        if not isinstance(raw, dict):
            raise self.fail(None, None, "arena", "must be a table", "write [arena] with path = ... under it")
        for key in raw:
            if key not in _ARENA_KEYS:
                raise self.fail("arena", None, key, "unknown key", f"[arena] takes {', '.join(sorted(_ARENA_KEYS))}")
        if not isinstance(raw.get("path"), str) or not raw["path"]:
            raise self.fail("arena", None, "path" if "path" in raw else None, "needs path, a string",
                            'e.g. path = "/dev/shm/experts.arena"')
        size = None
        if "size" in raw:
            try:
                size = parse_size(raw["size"])
            except (GpuwardenError, AttributeError):  # AttributeError: a TOML value that is not a string
                raise self.fail("arena", None, "size", f"cannot read size {raw['size']!r}",
                                'write e.g. size = "64GiB"') from None
        source = raw.get("source")
        if source is not None and not isinstance(source, str):
            raise self.fail("arena", None, "source", "must be a path string", 'e.g. source = "/models/experts.bin"')
        return ArenaConfig(path=raw["path"], size=size, source=source)

    def stagger(self, raw: Any) -> StaggerConfig:
        if not isinstance(raw, dict):
            raise self.fail(None, None, "stagger", "must be a table", "write [stagger] with slots = N under it")
        for key in raw:
            if key not in _STAGGER_KEYS:
                raise self.fail("stagger", None, key, "unknown key",
                                f"[stagger] takes {', '.join(sorted(_STAGGER_KEYS))}")
        slots = raw.get("slots", 1)
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise self.fail("stagger", None, "slots", f"must be a whole number of at least 1, got {slots!r}",
                            "slots = 1 lets one engine register at a time")
        timeout = self.seconds("stagger", None, "registration_timeout",
                               raw.get("registration_timeout", DEFAULT_REGISTRATION_TIMEOUT))
        return StaggerConfig(slots=slots, registration_timeout=timeout)

    def seconds(self, table: str, index: int | None, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise self.fail(table, index, key, f"must be a number of seconds, got {value!r}",
                            f"e.g. {key} = 30")
        return float(value)

    def engine(self, i: int, raw: Any, own_keys: set[str]) -> EngineConfig:
        t = "engines"
        if not isinstance(raw, dict):
            raise self.fail(t, i, None, "must be a table", "write [[engines]] followed by its keys")
        for key in raw:
            if key not in _ENGINE_KEYS:
                raise self.fail(t, i, key, "unknown key", f"an engine takes {', '.join(sorted(_ENGINE_KEYS))}")

        def where(key: str) -> tuple[str, int | None]:
            # A value inherited from [defaults] is wrong there, not in the engine.
            return ("defaults", None) if key in raw and key not in own_keys else (t, i)

        name = raw.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise self.fail(t, i, "name" if "name" in raw else None,
                            f"needs name: letters, digits, '.', '_' or '-', got {name!r}", 'e.g. name = "dp0"')
        argv = raw.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise self.fail(*where("argv"), "argv" if "argv" in raw else None,
                            "argv must be a non-empty list of strings",
                            'e.g. argv = ["python", "-m", "myengine", "--port", "8000"]')
        gpu = raw.get("gpu")
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
            raise self.fail(t, i, "gpu", f"must be a GPU index (0, 1, ...), got {gpu!r}", "e.g. gpu = 0")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, (str, int, float)) for v in env.values()):
            raise self.fail(*where("env"), "env", "must be a table of NAME = \"value\"",
                            'e.g. env = { NCCL_DEBUG = "INFO" }')
        workdir = raw.get("workdir")
        if workdir is not None and not isinstance(workdir, str):
            raise self.fail(*where("workdir"), "workdir", "must be a path string", 'e.g. workdir = "/srv/engine"')
        progress = raw.get("progress", "status")
        if progress not in PROGRESS_KINDS:
            raise self.fail(*where("progress"), "progress", f"must be one of {', '.join(PROGRESS_KINDS)}, got {progress!r}",
                            '"status": the engine speaks the status protocol; "log": set registered_pattern; '
                            '"preload": gpuwarden interposes its register calls')
        patterns = {}
        for key in ("registered_pattern", "ready_pattern"):
            value = raw.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise self.fail(*where(key), key, "must be a regular expression string", f'e.g. {key} = "session is up"')
            try:
                re.compile(value)
            except re.error as exc:
                raise self.fail(*where(key), key, f"not a valid regular expression ({exc})",
                                "Python `re` syntax; escape literal brackets with \\\\") from None
            patterns[key] = value
        if progress == "log" and "registered_pattern" not in patterns:
            raise self.fail(*where("progress"), "progress", 'progress = "log" needs registered_pattern',
                            'add registered_pattern = "a line the engine prints once registered"')
        stop_signal = raw.get("stop_signal", "SIGTERM")
        if not isinstance(stop_signal, str) or _signal_number(stop_signal) is None:
            raise self.fail(*where("stop_signal"), "stop_signal", f"unknown signal {stop_signal!r}",
                            'e.g. stop_signal = "SIGINT"')
        restart = raw.get("restart", "no")
        if restart not in RESTART_POLICIES:
            raise self.fail(*where("restart"), "restart", f"must be one of {', '.join(RESTART_POLICIES)}, got {restart!r}",
                            'restart = "on-failure" restarts after a crash, with backoff and a start limit')
        burst = raw.get("start_limit_burst", 5)
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise self.fail(*where("start_limit_burst"), "start_limit_burst",
                            f"must be a whole number of at least 1, got {burst!r}", "e.g. start_limit_burst = 5")
        log_max = raw.get("log_max", DEFAULT_LOG_MAX)
        try:
            log_max = parse_size(log_max)
        except (GpuwardenError, AttributeError):  # AttributeError: a TOML value that is not a string
            raise self.fail(*where("log_max"), "log_max", f"cannot read size {log_max!r}", 'e.g. log_max = "64MiB"') from None
        if log_max < 4096:
            raise self.fail(*where("log_max"), "log_max", "must be at least 4KiB", 'e.g. log_max = "64MiB"')
        gated = raw.get("gated", True)
        if not isinstance(gated, bool):
            raise self.fail(*where("gated"), "gated", f"must be true or false, got {gated!r}", "e.g. gated = false")
        release = self.gate_release(where, raw, progress, patterns)
        threshold = raw.get("register_threshold", DEFAULT_REGISTER_THRESHOLD)
        try:
            if isinstance(threshold, bool) or parse_size(threshold) < 0:
                raise GpuwardenError("not a size")
            threshold = parse_size(threshold)
        except (GpuwardenError, AttributeError):  # AttributeError: a TOML value that is not a string
            raise self.fail(*where("register_threshold"), "register_threshold", f"cannot read size {threshold!r}",
                            'e.g. register_threshold = "256MiB" (registrations below it pass ungated)') from None
        secs = {key: self.seconds(*where(key), key, raw[key])
                for key in ("stop_grace", "restart_backoff", "restart_backoff_max", "start_limit_interval") if key in raw}
        return EngineConfig(
            name=name, argv=tuple(argv), gpu=gpu, env={k: str(v) for k, v in env.items()}, workdir=workdir,
            progress=progress, stop_signal=_signal_name(stop_signal), restart=restart,
            start_limit_burst=burst, log_max=log_max, gated=gated, gate_release=release,
            register_threshold=threshold, **patterns, **secs,
        )

    def gate_release(self, where: Any, raw: dict[str, Any], progress: str, patterns: dict[str, str]) -> str:
        """When the gate slot goes: "registered", "ready" (needs ready_pattern) or "<N>s" after registered."""
        value = raw.get("gate_release", "registered")
        if not isinstance(value, str) or not GATE_RELEASE_RE.match(value.strip()):
            raise self.fail(*where("gate_release"), "gate_release",
                            f'must be "registered", "ready" or a number of seconds like "30s", got {value!r}',
                            'gate_release = "ready" holds the slot until ready_pattern appears')
        value = value.strip()
        if value != "registered" and progress == "status":
            raise self.fail(*where("gate_release"), "gate_release",
                            'only engines with progress = "preload" or "log" can have the gate held for them',
                            "a status-protocol engine releases its own slot; drop gate_release or change progress")
        if value == "ready" and "ready_pattern" not in patterns:
            raise self.fail(*where("gate_release"), "gate_release", 'gate_release = "ready" needs ready_pattern',
                            'add ready_pattern = "a line the engine prints once it serves"')
        return value


def _signal_number(name: str) -> int | None:
    text = name.strip().upper()
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(signal.Signals[text])
    except KeyError:
        return None


def _signal_name(name: str) -> str:
    return signal.Signals(_signal_number(name)).name


def signal_number(name: str) -> int:
    """The number of a signal named like "SIGTERM" or "term" (already validated)."""
    number = _signal_number(name)
    if number is None:
        raise ConfigError(f"unknown signal {name!r}", 'use a name such as "SIGTERM" or "SIGINT"')
    return number


def effective_settings(settings: Settings, config: NodeConfig | None = None) -> Settings:
    """Settings with the config's state_dir applied when neither --state-dir nor the environment chose one."""
    import os

    from .settings import default_state_dir

    if os.environ.get("GPUWARDEN_STATE_DIR") or settings.state_dir != default_state_dir():
        return settings
    if config is None:
        try:
            config = load(settings)
        except ConfigError:
            return settings
    if config.state_dir is None:
        return settings
    return settings.with_(state_dir=config.state_dir)
