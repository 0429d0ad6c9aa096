"""The node config (TOML): the arena, the engines to supervise, the stagger policy, the state dir.

`load(settings)` parses and validates it; every error names the file, the line and the key.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from gpuwarden.ops.foundation import inputs, tomlpos
from gpuwarden.ops.config.agent import DEFAULT as AGENT_DEFAULTS
from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.config.agent import parse as parse_agent
from gpuwarden.ops.foundation.errors import ConfigError, GpuwardenError
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.paths import default_state_dir
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.units import fmt_bytes, parse_size

PROGRESS_KINDS = ("status", "log", "preload")
RESTART_POLICIES = ("no", "on-failure")
DEFAULT_LOG_MAX = 16 << 20
DEFAULT_REGISTRATION_TIMEOUT = 600.0
DEFAULT_REGISTER_THRESHOLD = 256 << 20
GATE_RELEASE_RE = re.compile(r"^(registered|ready|(\d+(\.\d+)?)s)$")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # fullmatch: no trailing newline

# Keys each table accepts; anything else is a typo worth stopping for.
_TOP_KEYS = {"state_dir", "arena", "stagger", "engines", "defaults", "agent", "kubernetes"}
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
    agent: AgentConfig = AGENT_DEFAULTS  # the [agent] table (gpuwarden.ops.config.agent)
    kubernetes: Any = None  # gpuwarden.ops.config.kubernetes.KubernetesConfig when the file has a [kubernetes] table

    def engine(self, name: str) -> EngineConfig | None:
        return next((e for e in self.engines if e.name == name), None)


MAX_CONFIG_BYTES = 1 << 20
MAX_ENGINES = 1024
MAX_SLOTS = 1024
MAX_GPU_INDEX = 1023
MAX_SECONDS = 1e7  # about 16 weeks: any duration past this is a typo
MAX_LOG = 1 << 40
MAX_PATTERN = 1024
MAX_DEPTH = 16  # tables/arrays nested deeper than any node config needs
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigErrors(ConfigError):
    """Several things wrong with one config: `errors` has each as a ConfigError (message names file, line, key)."""

    def __init__(self, errors: list[ConfigError]):
        first = errors[0]
        more = f" (and {len(errors) - 1} more: `gpuwarden config check` lists them all)" if len(errors) > 1 else ""
        super().__init__(first.message + more, first.hint)
        self.errors = errors


def read_text(path: Path) -> str:
    """The config's text: a regular file, at most MAX_CONFIG_BYTES, UTF-8; else one ConfigError."""
    try:
        data = inputs.read_regular(path, "node config", MAX_CONFIG_BYTES,
                                   "write one (`gpuwarden config example` prints a start) or pass --config PATH")
    except GpuwardenError as exc:
        raise ConfigError(exc.message, exc.hint) from None
    try:
        return data.decode("utf-8")  # TOML is UTF-8 whatever the locale
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not valid TOML (not UTF-8 text: byte 0x{exc.object[exc.start]:02x})",
                          "save the file as UTF-8; is it the node config at all?") from None


def load(settings: Settings, gpu_count: int | None = None) -> NodeConfig:
    """Read and validate settings.config_path; raise ConfigError (ConfigErrors for several) naming file, line, key.

    With `gpu_count`, an engine's GPU this node lacks is one of those errors (reported with the others)."""
    path = settings.config_path
    # A sampler asks on every refresh through its FileCache, which calls this only when the file changed.
    try:
        os.stat(path)
    except FileNotFoundError:
        raise ConfigError(
            f"node config {path} does not exist",
            "write one (`gpuwarden config example` prints a start) or pass --config PATH",
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the node config {path}: {exc.strerror}",
                          "run as a user that can read it, or pass --config PATH") from None
    return parse(read_text(path), path, gpu_count)  # read_text names a directory or a special file in one line


def parse(text: str, path: Path, gpu_count: int | None = None) -> NodeConfig:
    depth, line = _nesting(text)
    if depth > MAX_DEPTH:
        raise ConfigError(f"{path}:{line}: tables or arrays nested more than {MAX_DEPTH} deep",
                          "a node config nests a few levels at most; is it the right file?")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(exc, text, path) from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML (nested too deeply)", "is it the node config at all?") from None
    validator = _Validator(text, path)
    validator.gpu_count = gpu_count
    return validator.node(data)


def _nesting(text: str) -> tuple[int, int]:
    """How deep brackets and braces nest outside strings and comments (a cheap guard before tomllib recurses)."""
    depth = best = 0
    line = best_line = 1
    quote = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            if quote in ('"', "'"):
                quote = None
        elif quote:
            if c == "\\" and quote in ('"', '"""'):
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "\"'":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else c
            i += len(quote)
            continue
        elif c in "[{":
            depth += 1
            if depth > best:
                best, best_line = depth, line
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return best, best_line


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
    shown = f": {printable(source[:120])!r}" if source else ""
    return ConfigError(
        f"{path}:{line}: not valid TOML ({msg.lower()}){shown}",
        "fix that line; strings need quotes, lists are [\"a\", \"b\"], tables are [name] on a line of their own",
    )


class _Validator:
    """Checks parsed data, collecting every error (each with the line of its key) before giving up."""

    def __init__(self, text: str, path: Path):
        self.where = tomlpos.locate(text)
        self.path = path
        self.errors: list[ConfigError] = []
        self.gpu_count: int | None = None  # the node's GPUs, when the engines' indexes are checked against them

    # --- errors --------------------------------------------------------------------------------

    def fail(self, table: str | None, index: int | None, key: str | tuple[str, ...] | None, problem: str,
             hint: str) -> ConfigError:
        """An error for `key` (a name, or a path such as ("env", "X")) in [table] (or the index-th [[table]]);
        its line comes from the text."""
        keys = [k for k in (table, index) if k is not None] + list(key if isinstance(key, tuple) else (key,) if key else ())
        line = tomlpos.line_of(self.where, tuple(keys))
        where = printable(".".join(str(k) if not isinstance(k, int) else f"[{k}]" for k in keys).replace(".[", "["))
        return ConfigError(f"{self.path}:{line}: {where}: {problem}" if where else f"{self.path}:{line}: {problem}",
                           hint)

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        """Record a ConfigError raised inside and carry on with the next key."""
        try:
            yield
        except ConfigError as exc:
            self.errors.append(exc)

    def done(self) -> None:
        # A [defaults] key is checked once per engine that inherits it: the operator must read it once.
        unique: dict[tuple[str, str | None], ConfigError] = {}
        for exc in self.errors:
            unique.setdefault((exc.message, exc.hint), exc)
        self.errors = list(unique.values())
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigErrors(sorted(self.errors, key=_line_of_error))

    def _missing_gpu(self, index: int, gpu: int, gpu_count: int) -> ConfigError:
        return self.fail("engines", index, "gpu", f"GPU {gpu} does not exist on this node (it has GPUs 0-"
                         f"{gpu_count - 1})" if gpu_count else f"GPU {gpu} does not exist: this node has no GPU",
                         "see `gpuwarden status` for the GPU indexes")

    # --- the tables ------------------------------------------------------------------------

    def node(self, data: dict[str, Any]) -> NodeConfig:
        for key in data:
            if key not in _TOP_KEYS:
                self.errors.append(self.fail(None, None, key, "unknown key",
                                             f"the top level takes {', '.join(sorted(_TOP_KEYS))}"))
        state_dir = None
        with self.check():
            state_dir = self.path_string(None, None, "state_dir", data.get("state_dir"), 'e.g. state_dir = "/run/gpuwarden"',
                                         absolute=True)
        arena = stagger = None
        with self.check():
            arena = self.arena(data["arena"]) if "arena" in data else None
        with self.check():
            stagger = self.stagger(data.get("stagger", {}))
        defaults = data.get("defaults", {})
        if not isinstance(defaults, dict):
            self.errors.append(self.fail(None, None, "defaults", "must be a table",
                                         "write [defaults] with engine keys under it"))
            defaults = {}
        for key in list(defaults):
            if key not in _ENGINE_KEYS or key in _PER_ENGINE_ONLY:
                self.errors.append(self.fail("defaults", None, key, "not a key [defaults] can set",
                                             f"[defaults] takes engine keys except {', '.join(sorted(_PER_ENGINE_ONLY))}"))
                defaults = {k: v for k, v in defaults.items() if k != key}
        raw_engines = data.get("engines", [])
        if not isinstance(raw_engines, list):
            self.errors.append(self.fail(None, None, "engines", "must be an array of tables",
                                         "write each engine as [[engines]] followed by its keys"))
            raw_engines = []
        if len(raw_engines) > MAX_ENGINES:
            self.errors.append(self.fail(None, None, "engines", f"{len(raw_engines)} engines; at most {MAX_ENGINES}",
                                         "one node runs a few engines per GPU at most"))
            raw_engines = []
        engines = []
        names: dict[str, int] = {}
        for i, raw in enumerate(raw_engines):
            if not isinstance(raw, dict):
                self.errors.append(self.fail("engines", i, None, f"must be a table, got {_show(raw)}",
                                             "write each engine as [[engines]] followed by its keys"))
                continue
            e = self.engine(i, {**defaults, **raw}, set(raw))
            if e is None:
                continue
            with self.check():
                if e.name in names:
                    raise self.fail("engines", i, "name", f"engine name {e.name!r} is used twice",
                                    "give every engine its own name")
                names[e.name] = i
                engines.append(e)
        if self.gpu_count is not None:
            for i, raw in enumerate(raw_engines):
                gpu = {**defaults, **raw}.get("gpu") if isinstance(raw, dict) else None
                if isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu <= MAX_GPU_INDEX \
                        and gpu >= self.gpu_count:
                    self.errors.append(self._missing_gpu(i, gpu, self.gpu_count))
        agent = AGENT_DEFAULTS
        if "agent" in data:
            with self.check():
                agent = parse_agent(data["agent"], lambda key, problem, hint: self.fail(
                    None if not key else "agent", None, key or "agent", problem, hint))
        kubernetes = None
        if "kubernetes" in data:
            with self.check():
                # deferred: status reads node.toml: only a node with a [kubernetes] table pays for that code
                from gpuwarden.ops.config import kubernetes as k8s_config
                kubernetes = k8s_config.parse(data["kubernetes"], lambda key, problem, hint: self.fail(
                    "kubernetes", None, key, problem, hint))
        self.done()
        assert stagger is not None
        return NodeConfig(path=self.path, engines=tuple(engines), arena=arena, stagger=stagger,
                          state_dir=Path(state_dir) if state_dir else None, agent=agent, kubernetes=kubernetes)

    def path_string(self, table: str | None, index: int | None, key: str, value: Any, hint: str,
                    absolute: bool = False) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(table, index, key, f"must be a path string, got {_show(value)}", hint)
        if "\0" in value or "\n" in value:
            raise self.fail(table, index, key, "a path cannot hold a NUL or a newline", hint)
        if absolute and not value.startswith("/"):
            raise self.fail(table, index, key, f"must be an absolute path, got {_show(value)}", hint)
        return value

    def arena(self, raw: Any) -> ArenaConfig | None:
        if not isinstance(raw, dict):
            raise self.fail(None, None, "arena", "must be a table", "write [arena] with path = ... under it")
        for key in raw:
            if key not in _ARENA_KEYS:
                self.errors.append(self.fail("arena", None, key, "unknown key",
                                             f"[arena] takes {', '.join(sorted(_ARENA_KEYS))}"))
        path = size = source = None
        with self.check():
            if "path" not in raw:
                raise self.fail("arena", None, None, "needs path, a string", 'e.g. path = "/dev/shm/experts.arena"')
            # Absolute: every engine maps it from its own workdir, and a relative path names a file per workdir.
            path = self.path_string("arena", None, "path", raw["path"], 'e.g. path = "/dev/shm/experts.arena"',
                                    absolute=True)
        with self.check():
            if "size" in raw:
                size = self.size("arena", None, "size", raw["size"], 'write e.g. size = "64GiB"', low=1, high=1 << 50)
        with self.check():
            source = self.path_string("arena", None, "source", raw.get("source"), 'e.g. source = "/models/experts.bin"')
        return ArenaConfig(path=path, size=size, source=source) if path else None

    def stagger(self, raw: Any) -> StaggerConfig:
        if not isinstance(raw, dict):
            self.errors.append(self.fail(None, None, "stagger", "must be a table",
                                         "write [stagger] with slots = N under it"))
            return StaggerConfig()
        for key in raw:
            if key not in _STAGGER_KEYS:
                self.errors.append(self.fail("stagger", None, key, "unknown key",
                                             f"[stagger] takes {', '.join(sorted(_STAGGER_KEYS))}"))
        slots, timeout = 1, DEFAULT_REGISTRATION_TIMEOUT
        with self.check():
            slots = self.whole("stagger", None, "slots", raw.get("slots", 1), 1, MAX_SLOTS,
                               "slots = 1 lets one engine register at a time")
        with self.check():
            timeout = self.seconds("stagger", None, "registration_timeout",
                                   raw.get("registration_timeout", DEFAULT_REGISTRATION_TIMEOUT))
        return StaggerConfig(slots=slots, registration_timeout=timeout)

    def whole(self, table: str | None, index: int | None, key: str, value: Any, low: int, high: int,
              hint: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(table, index, key, f"must be a whole number of at least {low} and at most {high}, "
                            f"got {_show(value)}", hint)
        return value

    def seconds(self, table: str, index: int | None, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_SECONDS:
            raise self.fail(table, index, key, f"must be a number of seconds from 0 to {MAX_SECONDS:g}, got {_show(value)}",
                            f"e.g. {key} = 30")
        return float(value)

    def size(self, table: str | None, index: int | None, key: str, value: Any, hint: str, *, low: int,
             high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.fail(table, index, key, f"cannot read size {_show(value)}", hint)
        try:
            n = parse_size(value)
        except GpuwardenError:
            raise self.fail(table, index, key, f"cannot read size {_show(value)}", hint) from None
        if not low <= n <= high:
            raise self.fail(table, index, key, f"must be from {fmt_bytes(low)} to {fmt_bytes(high)}, got {_show(value)}",
                            hint)
        return n

    def pattern(self, table: str, index: int | None, key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self.fail(table, index, key, "must be a regular expression string", f'e.g. {key} = "session is up"')
        problem = regex_problem(value)
        if problem:
            raise self.fail(table, index, key, problem,
                            "Python `re` syntax; keep it simple: a literal phrase the engine prints, e.g. "
                            '"session is up"; escape literal brackets with \\\\')
        return value

    def engine(self, i: int, raw: dict[str, Any], own_keys: set[str]) -> EngineConfig | None:
        """The engine, or None when anything in it is wrong (every such error is recorded)."""
        t = "engines"
        for key in raw:
            if key not in _ENGINE_KEYS:
                self.errors.append(self.fail(t, i, key, "unknown key",
                                             f"an engine takes {', '.join(sorted(_ENGINE_KEYS))}"))

        def where(key: str) -> tuple[str, int | None]:
            # A value inherited from [defaults] is wrong there, not in the engine.
            return ("defaults", None) if key in raw and key not in own_keys else (t, i)

        values: dict[str, Any] = {}
        failed = len(self.errors)
        with self.check():
            name = raw.get("name")
            if not isinstance(name, str) or not NAME_RE.fullmatch(name):
                raise self.fail(t, i, "name" if "name" in raw else None,
                                f"needs name: letters, digits, '.', '_' or '-', got {_show(name)}", 'e.g. name = "dp0"')
            values["name"] = name
        with self.check():
            argv = raw.get("argv")
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) \
                    or len(argv) > 4096:
                raise self.fail(*where("argv"), "argv" if "argv" in raw else None,
                                "argv must be a non-empty list of strings",
                                'e.g. argv = ["python", "-m", "myengine", "--port", "8000"]')
            if not argv[0] or any("\0" in a for a in argv):
                raise self.fail(*where("argv"), "argv", "argv cannot hold an empty program name or a NUL character",
                                "the program is argv[0]; each argument is one string")
            values["argv"] = tuple(argv)
        with self.check():
            gpu = raw.get("gpu")
            if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu <= MAX_GPU_INDEX):
                raise self.fail(t, i, "gpu", f"must be a GPU index (0, 1, ...), got {_show(gpu)}", "e.g. gpu = 0")
            values["gpu"] = gpu
        with self.check():
            values["env"] = self.env(*where("env"), raw.get("env", {}))
        with self.check():
            values["workdir"] = self.path_string(*where("workdir"), "workdir", raw.get("workdir"),
                                                 'e.g. workdir = "/srv/engine"')
        progress = raw.get("progress", "status")
        with self.check():
            if progress not in PROGRESS_KINDS:
                raise self.fail(*where("progress"), "progress",
                                f"must be one of {', '.join(PROGRESS_KINDS)}, got {_show(progress)}",
                                '"status": the engine speaks the status protocol; "log": set registered_pattern; '
                                '"preload": gpuwarden interposes its register calls')
            values["progress"] = progress
        for key in ("registered_pattern", "ready_pattern"):
            if raw.get(key) is not None:
                with self.check():
                    values[key] = self.pattern(*where(key), key, raw[key])
        with self.check():
            if progress == "log" and raw.get("registered_pattern") is None:
                raise self.fail(*where("progress"), "progress", 'progress = "log" needs registered_pattern',
                                'add registered_pattern = "a line the engine prints once registered"')
        with self.check():
            stop_signal = raw.get("stop_signal", "SIGTERM")
            if not isinstance(stop_signal, str) or _signal_number(stop_signal) is None:
                raise self.fail(*where("stop_signal"), "stop_signal", f"unknown signal {_show(stop_signal)}",
                                'e.g. stop_signal = "SIGINT"')
            values["stop_signal"] = _signal_name(stop_signal)
        with self.check():
            restart = raw.get("restart", "no")
            if restart not in RESTART_POLICIES:
                raise self.fail(*where("restart"), "restart",
                                f"must be one of {', '.join(RESTART_POLICIES)}, got {_show(restart)}",
                                'restart = "on-failure" restarts after a crash, with backoff and a start limit')
            values["restart"] = restart
        with self.check():
            values["start_limit_burst"] = self.whole(*where("start_limit_burst"), "start_limit_burst",
                                                     raw.get("start_limit_burst", 5), 1, 1000,
                                                     "e.g. start_limit_burst = 5")
        with self.check():
            values["log_max"] = self.size(*where("log_max"), "log_max", raw.get("log_max", DEFAULT_LOG_MAX),
                                          'e.g. log_max = "64MiB"', low=4096, high=MAX_LOG)
        with self.check():
            gated = raw.get("gated", True)
            if not isinstance(gated, bool):
                raise self.fail(*where("gated"), "gated", f"must be true or false, got {_show(gated)}",
                                "e.g. gated = false")
            values["gated"] = gated
        for key in ("stop_grace", "restart_backoff", "restart_backoff_max", "start_limit_interval"):
            if key in raw:
                with self.check():
                    values[key] = self.seconds(*where(key), key, raw[key])
        with self.check():
            values["gate_release"] = self.gate_release(where, raw, progress, values)
        with self.check():
            values["register_threshold"] = self.size(
                *where("register_threshold"), "register_threshold",
                raw.get("register_threshold", DEFAULT_REGISTER_THRESHOLD),
                'e.g. register_threshold = "256MiB" (registrations below it pass ungated)', low=0, high=1 << 50)
        return None if len(self.errors) > failed else EngineConfig(**values)

    def gate_release(self, where: Callable[[str], tuple[str, int | None]], raw: dict[str, Any], progress: str, patterns: dict[str, Any]) -> str:
        """When the gate slot goes: "registered", "ready" (needs ready_pattern) or "<N>s" after registered."""
        value = raw.get("gate_release", "registered")
        if not isinstance(value, str) or not GATE_RELEASE_RE.match(value.strip()):
            raise self.fail(*where("gate_release"), "gate_release",
                            f'must be "registered", "ready" or a number of seconds like "30s", got {_show(value)}',
                            'gate_release = "ready" holds the slot until ready_pattern appears')
        value = value.strip()
        if value != "registered" and progress == "status":
            raise self.fail(*where("gate_release"), "gate_release",
                            'only engines with progress = "preload" or "log" can have the gate held for them',
                            "a status-protocol engine releases its own slot; drop gate_release or change progress")
        if value == "ready" and patterns.get("ready_pattern") is None:
            raise self.fail(*where("gate_release"), "gate_release", 'gate_release = "ready" needs ready_pattern',
                            'add ready_pattern = "a line the engine prints once it serves"')
        if value.endswith("s") and float(value[:-1]) > MAX_SECONDS:
            raise self.fail(*where("gate_release"), "gate_release", f"at most {MAX_SECONDS:g} seconds",
                            'e.g. gate_release = "30s"')
        return value

    def env(self, table: str, index: int | None, value: Any) -> dict[str, str]:
        hint = 'e.g. env = { NCCL_DEBUG = "INFO" }'
        if not isinstance(value, dict):
            raise self.fail(table, index, "env", 'must be a table of NAME = "value"', hint)
        out = {}
        for name, v in value.items():
            with self.check():
                if not ENV_NAME_RE.fullmatch(name):
                    raise self.fail(table, index, ("env", name),
                                    f"{_show(name)} is not a variable name (letters, digits and '_', no '=')", hint)
                if isinstance(v, bool) or not isinstance(v, (str, int, float)) or "\0" in str(v):
                    raise self.fail(table, index, ("env", name), f"must be a string without NUL, got {_show(v)}", hint)
                out[name] = str(v)
        return out


def _line_of_error(exc: ConfigError) -> int:
    m = re.match(r"[^\n]*?:(\d+): ", exc.message)
    return int(m.group(1)) if m else 0


def _show(value: Any) -> str:
    text = printable(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def regex_problem(pattern: str) -> str | None:
    """Why `pattern` may not follow an engine's log (None when it may): too long, not valid, or shaped to
    backtrack catastrophically (a repeat inside a repeat) on a long line. Checked once, when the config is."""
    if len(pattern) > MAX_PATTERN:
        return f"a pattern of {len(pattern)} characters; at most {MAX_PATTERN}"
    if "\0" in pattern:
        return "a pattern cannot hold a NUL character"
    try:
        compiled = re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        return f"not a valid regular expression ({printable(str(exc))})"
    if compiled.groups > 32:
        return f"{compiled.groups} groups; a log pattern needs a few at most"
    try:
        from re import _parser  # the parse tree re itself builds
        tree = _parser.parse(pattern)
    except Exception:  # noqa: BLE001 - only an extra check; re.compile above has already accepted it
        return None
    if _nested_repeat(tree, False):
        return "a repeat inside a repeat (like (a+)+ or (\\w*\\s?)*) can take forever on a long line"
    return None


def _nested_repeat(items: Any, outer: bool) -> bool:
    """True when an unbounded repeat (or one of more than 100) contains an unbounded repeat."""
    for op, arg in getattr(items, "data", items):
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            unbounded = high >= _UNBOUNDED
            if unbounded and outer:
                return True
            if _nested_repeat(sub, outer or unbounded or high > 100):
                return True
        elif name == "SUBPATTERN":
            if _nested_repeat(arg[-1], outer):
                return True
        elif name == "BRANCH":
            if any(_nested_repeat(b, outer) for b in arg[1]):
                return True
        elif name in ("ASSERT", "ASSERT_NOT"):
            if _nested_repeat(arg[1], outer):
                return True
        elif name == "GROUPREF_EXISTS":
            if any(b is not None and _nested_repeat(b, outer) for b in arg[1:]):
                return True
    return False


_UNBOUNDED = 1 << 16  # re's MAXREPEAT is far above; a repeat bounded this high is as good as unbounded


def check_gpus(config: NodeConfig, gpu_count: int) -> list[ConfigError]:
    """Engines whose GPU this node does not have, each as an error naming its line."""
    v = _Validator(read_text(config.path) if config.path.exists() else "", config.path)
    return [v._missing_gpu(i, e.gpu, gpu_count)
            for i, e in enumerate(config.engines) if e.gpu is not None and e.gpu >= gpu_count]


def _signal_number(name: str) -> int | None:
    text = name.strip().upper()
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(signal.Signals[text])
    except KeyError:
        return None


def _signal_name(name: str) -> str:
    number = _signal_number(name)
    if number is None:  # the caller checked it first: a ValueError, as Signals(None) raised
        raise ValueError(f"{name!r} is not a signal")
    return signal.Signals(number).name


def signal_number(name: str) -> int:
    """The number of a signal named like "SIGTERM" or "term" (already validated)."""
    number = _signal_number(name)
    if number is None:
        raise ConfigError(f"unknown signal {name!r}", 'use a name such as "SIGTERM" or "SIGINT"')
    return number


def effective_settings(settings: Settings, config: NodeConfig | None = None) -> Settings:
    """Settings with the config's state_dir applied when neither --state-dir nor the environment chose one."""
    import os

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


def kubernetes_config(settings: Settings, **overrides: Any) -> Any:
    """The node config's [kubernetes] table (defaults without one), with command-line overrides applied."""
    from dataclasses import replace

    # deferred: status reads node.toml: only a node with a [kubernetes] table pays for that code
    from gpuwarden.ops.config.kubernetes import KubernetesConfig
    cfg = KubernetesConfig()
    if settings.config_path.exists():
        cfg = load(settings).kubernetes or cfg
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
