"""The node config (TOML): the arena, the engines to supervise, the stagger policy, the state dir.

`load(settings)` parses it, checks each table against ops/config/keys.py, then the rules across keys; every error
(all of them, not the first) names the file, the line and the key.
"""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from gpuwarden.ops.config import keys, schema
from gpuwarden.ops.config.agent import DEFAULT as AGENT_DEFAULTS
from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.config.agent import parse as parse_agent
from gpuwarden.ops.config.schema import regex_problem  # noqa: F401 (re-exported: tests/integration/project/test_harden_fuzz.py)
from gpuwarden.ops.foundation import inputs, tomlpos
from gpuwarden.ops.foundation.errors import ConfigError, GpuwardenError
from gpuwarden.ops.foundation.interrupts import signal_number as _signal_number
from gpuwarden.ops.foundation.safetext import printable
from gpuwarden.ops.foundation.settings import Settings

_ENGINE = keys.section("engines")
PROGRESS_KINDS = _ENGINE["progress"].choices
RESTART_POLICIES = _ENGINE["restart"].choices
DEFAULT_LOG_MAX: int = _ENGINE["log_max"].default
DEFAULT_REGISTRATION_TIMEOUT: float = keys.default("stagger", "registration_timeout")
DEFAULT_REGISTER_THRESHOLD: int = _ENGINE["register_threshold"].default
NAME_RE = schema.NAME_RE
ENV_NAME_RE = schema.ENV_NAME_RE
MAX_SLOTS = int(keys.key("stagger", "slots").high or 0)
# The tables of the top level; its other keys are ops/config/keys.py's section "".
_TABLES = ("arena", "stagger", "engines", "defaults", "agent", "kubernetes")


@dataclass(frozen=True)
class ArenaConfig:
    path: str
    size: int | None = None
    source: str | None = None


@dataclass(frozen=True)
class StaggerConfig:
    slots: int = keys.default("stagger", "slots")
    registration_timeout: float = keys.default("stagger", "registration_timeout")


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
    progress: str = keys.default("engines", "progress")
    registered_pattern: str | None = None
    ready_pattern: str | None = None
    stop_signal: str = keys.default("engines", "stop_signal")
    stop_grace: float = keys.default("engines", "stop_grace")
    restart: str = keys.default("engines", "restart")
    restart_backoff: float = keys.default("engines", "restart_backoff")
    restart_backoff_max: float = keys.default("engines", "restart_backoff_max")
    start_limit_burst: int = keys.default("engines", "start_limit_burst")
    start_limit_interval: float = keys.default("engines", "start_limit_interval")
    log_max: int = keys.default("engines", "log_max")
    gated: bool = keys.default("engines", "gated")
    gate_release: str = keys.default("engines", "gate_release")
    register_threshold: int = keys.default("engines", "register_threshold")
    # Pinned host memory (hipHostMalloc & co) the engine allocates besides the arena: KFD charges it against the
    # same system-memory limit as the registration (ops/arena/budget.py). None: the budget's stated default.
    pinned_headroom: int | None = None

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


MAX_CONFIG_BYTES = keys.MAX_CONFIG_BYTES
MAX_ENGINES = 1024
MAX_SECONDS = keys.MAX_SECONDS
MAX_DEPTH = 16  # tables/arrays nested deeper than any node config needs


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
    """Checks parsed data against ops/config/keys.py, collecting every error (each with the line of its key)."""

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
        keys_ = [k for k in (table, index) if k is not None] + list(key if isinstance(key, tuple) else (key,) if key else ())
        line = tomlpos.line_of(self.where, tuple(keys_))
        where = printable(".".join(str(k) if not isinstance(k, int) else f"[{k}]" for k in keys_).replace(".[", "["))
        return ConfigError(f"{self.path}:{line}: {where}: {problem}" if where else f"{self.path}:{line}: {problem}",
                           hint)

    def add(self, table: str | None, index: int | None, problems: list[schema.Problem]) -> None:
        for key, sub, problem, hint in problems:
            self.errors.append(self.fail(table, index, (key, *sub) if key else None, problem, hint))

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        """Record a ConfigError raised inside and carry on with the next key."""
        try:
            yield
        except ConfigError as exc:
            self.errors.append(exc)

    def done(self) -> None:
        # A [defaults] key an engine's rule finds wrong is wrong once for every engine: the operator reads it once.
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

    def table(self, data: dict[str, Any], name: str, hint: str) -> dict[str, Any] | None:
        """data[name] when it is a table; None (and an error) when it is something else."""
        raw = data.get(name, {})
        if isinstance(raw, dict):
            return raw
        self.errors.append(self.fail(None, None, name, "must be a table", hint))
        return None

    # --- the tables ------------------------------------------------------------------------

    def node(self, data: dict[str, Any]) -> NodeConfig:
        top = keys.section("")
        for key in data:
            if key not in top and key not in _TABLES:
                self.errors.append(self.fail(None, None, key, "unknown key",
                                             f"the top level takes {', '.join(sorted((*top, *_TABLES)))}"))
        plain = {k: v for k, v in data.items() if k in top}
        values, problems = schema.check_table(plain, top, "the top level")
        self.add(None, None, problems)
        state_dir = values.get("state_dir")
        arena = None
        raw_arena = self.table(data, "arena", "write [arena] with path = ... under it")
        if raw_arena is not None and "arena" in data:
            values, problems = schema.check_table(raw_arena, keys.section("arena"), "[arena]")
            self.add("arena", None, problems)
            arena = ArenaConfig(**values) if "path" in values else None
        stagger = StaggerConfig()
        raw_stagger = self.table(data, "stagger", "write [stagger] with slots = N under it")
        if raw_stagger is not None:
            values, problems = schema.check_table(raw_stagger, keys.section("stagger"), "[stagger]")
            self.add("stagger", None, problems)
            stagger = StaggerConfig(**values)
        engines = self.engines(data)
        agent = AGENT_DEFAULTS
        if "agent" in data:
            with self.check():
                agent = parse_agent(data["agent"], lambda key, problem, hint: self.fail(
                    None if not key else "agent", None, key or "agent", problem, hint), self.errors.append)
        kubernetes = None
        if "kubernetes" in data:
            # status reads node.toml: only a node with a [kubernetes] table pays for that code
            # deferred: keeps `gpuwarden doctor --help` cheap (3.2 ms there)
            from gpuwarden.ops.config import kubernetes as k8s_config
            with self.check():
                kubernetes = k8s_config.parse(data["kubernetes"], lambda key, problem, hint: self.fail(
                    "kubernetes", None, key, problem, hint), self.errors.append)
        self.done()
        return NodeConfig(path=self.path, engines=tuple(engines), arena=arena, stagger=stagger,
                          state_dir=Path(state_dir) if state_dir else None, agent=agent, kubernetes=kubernetes)

    def engines(self, data: dict[str, Any]) -> list[EngineConfig]:
        defaults = self.table(data, "defaults", "write [defaults] with engine keys under it") or {}
        own = {k: v for k, v in defaults.items() if k in _ENGINE and not _ENGINE[k].per_engine}
        for key in defaults:
            if key not in own:
                per_engine = ", ".join(sorted(k.name for k in _ENGINE.values() if k.per_engine))
                self.errors.append(self.fail("defaults", None, key, "not a key [defaults] can set",
                                             f"[defaults] takes engine keys except {per_engine}"))
        inherited, problems = schema.check_table(own, _ENGINE, "[defaults]", require=False)
        self.add("defaults", None, problems)
        defaults_failed = bool(problems)
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
                self.errors.append(self.fail("engines", i, None, f"must be a table, got {schema.show(raw)}",
                                             "write each engine as [[engines]] followed by its keys"))
                continue
            e = self.engine(i, raw, own, inherited, defaults_failed)
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
                gpu = raw.get("gpu") if isinstance(raw, dict) else None
                if isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu <= keys.MAX_GPU_INDEX \
                        and gpu >= self.gpu_count:
                    self.errors.append(self._missing_gpu(i, gpu, self.gpu_count))
        return engines

    def engine(self, i: int, raw: dict[str, Any], defaults_raw: dict[str, Any], inherited: dict[str, Any],
               defaults_failed: bool) -> EngineConfig | None:
        """The engine, or None when anything in it (or in the [defaults] it inherits) is wrong (every such
        error is recorded)."""
        failed = len(self.errors)
        own, problems = schema.check_table(raw, _ENGINE, "an engine", require=False)
        self.add("engines", i, problems)
        self.add("engines", i, schema.missing({**defaults_raw, **raw}, _ENGINE))
        values = {**inherited, **own}

        def where(key: str) -> tuple[str, int | None]:
            # A value inherited from [defaults] is wrong there, not in the engine.
            return ("defaults", None) if key in defaults_raw and key not in raw else ("engines", i)

        with self.check():
            self.rules(where, values)
        if len(self.errors) > failed or defaults_failed:
            return None
        return EngineConfig(**values)

    def rules(self, where: Callable[[str], tuple[str, int | None]], values: dict[str, Any]) -> None:
        """The checks that read several keys of one engine: what progress needs, when the gate slot goes."""
        progress = values.get("progress", _ENGINE["progress"].default)
        if progress == "log" and values.get("registered_pattern") is None:
            raise self.fail(*where("progress"), "progress", 'progress = "log" needs registered_pattern',
                            'add registered_pattern = "a line the engine prints once registered"')
        value = values.get("gate_release", "registered")
        if value != "registered" and progress == "status":
            raise self.fail(*where("gate_release"), "gate_release",
                            'only engines with progress = "preload" or "log" can have the gate held for them',
                            "a status-protocol engine releases its own slot; drop gate_release or change progress")
        if value == "ready" and values.get("ready_pattern") is None:
            raise self.fail(*where("gate_release"), "gate_release", 'gate_release = "ready" needs ready_pattern',
                            'add ready_pattern = "a line the engine prints once it serves"')
        if value.endswith("s") and float(value[:-1]) > MAX_SECONDS:
            raise self.fail(*where("gate_release"), "gate_release", f"at most {MAX_SECONDS:g} seconds",
                            'e.g. gate_release = "30s"')


def _line_of_error(exc: ConfigError) -> int:
    m = re.match(r"[^\n]*?:(\d+): ", exc.message)
    return int(m.group(1)) if m else 0


def signal_number(name: str) -> int:
    """The number of a signal named like "SIGTERM" or "term" (already validated)."""
    number = _signal_number(name)
    if number is None:
        raise ConfigError(f"unknown signal {name!r}", 'use a name such as "SIGTERM" or "SIGINT"')
    return number
