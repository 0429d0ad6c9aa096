"""gpuwarden's settings resolved once: table defaults < node config < environment < command line, all errors at once.

resolve() builds the Settings every command, the agent and the console get; state_dir() is its cheap part that
`status --json` needs to find the agent's socket (no Settings, no validator).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuwarden.ops.config import keys
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.paths import default_state_dir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: status --json resolves its state dir here
if TYPE_CHECKING:
    from typing import Any, Mapping

    from gpuwarden.ops.config.agent import AgentConfig
    from gpuwarden.ops.config.kubernetes import KubernetesConfig
    from gpuwarden.ops.foundation.settings import Settings

_UNREADABLE = object()  # a config that is there but does not read: its state_dir is unknown


class SettingsErrors(GpuwardenError):
    """Several global options or variables wrong at once: `errors` has each (fastcli.print_error lists them)."""

    def __init__(self, errors: list[GpuwardenError]):
        super().__init__(errors[0].message + f" (and {len(errors) - 1} more)", errors[0].hint)
        self.errors = errors


def _given(options: Mapping[str, object], environ: Mapping[str, str], k: keys.Key) -> tuple[object, str | None]:
    """(value, where it came from: the option or the variable) of a key set on the command line or in the
    environment; (None, None) when neither sets it. An empty value is no value, as the environment has it."""
    value = options.get(k.name)
    if value not in (None, ""):
        return value, k.option
    if k.env and environ.get(k.env):
        return environ[k.env], k.env
    return None, None


def config_path(options: Mapping[str, object], environ: Mapping[str, str]) -> Path:
    value, _ = _given(options, environ, keys.key("global", "config"))
    return Path(str(value)) if value is not None else Path(keys.default("global", "config"))


def _read_config(path: Path) -> bytes:
    """The config's bytes; OSError when it is missing, unreadable, not a regular file or over 1 MiB."""
    # Never blocks (a FIFO), never reads a device: the node config is a regular file of at most 1 MiB.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > keys.MAX_CONFIG_BYTES:
            raise OSError(f"{path} is not a node config")
        return os.read(fd, keys.MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)


def _config_state_dir(path: Path) -> object:
    """The node config's state_dir: a Path, None when the file does not exist or does not name one, or
    _UNREADABLE when it cannot be read, is not TOML, or its state_dir is not valid (loading the config says
    why: that error stays with the command that loads it)."""
    try:
        raw = _read_config(path)
    except FileNotFoundError:
        return None
    except OSError:
        return _UNREADABLE
    # deferred: keeps `gpuwarden status --json` cheap (6.5 ms there)
    import tomllib
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError):
        return _UNREADABLE
    value = data.get("state_dir")
    if value is None:
        return None
    return _UNREADABLE if keys.path_problem(keys.key("", "state_dir"), value) else Path(value)


def state_dir(options: Mapping[str, object], environ: Mapping[str, str] | None = None) -> Path | None:
    """The state dir resolve() would choose, cheaply (no Settings, no checks): command line, environment, node
    config, default. None when it would come from a node config that does not read: the caller then takes the
    full path, which reports it."""
    env = os.environ if environ is None else environ
    value, _ = _given(options, env, keys.key("", "state_dir"))
    if value is not None:
        return Path(str(value))
    found = _config_state_dir(config_path(options, env))
    if found is _UNREADABLE:
        return None
    return found if isinstance(found, Path) else default_state_dir(env)


def resolve(options: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None, *,
            check: bool = True) -> Settings:
    """The Settings of one command: each global key of ops/config/keys.py from its option, else its variable,
    else (state_dir) the node config, else its default. Every wrong option or variable is reported together;
    with `check`, the roots given must be directories and the state dir must pass statedir.check."""
    # status --json answered by the agent needs the state dir alone (state_dir() above)
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (0.5 ms there, 1.2 with the two below)
    from gpuwarden.ops.foundation import statedir
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (3.6 ms there)
    from gpuwarden.ops.foundation.settings import Settings
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (0.2 ms, 0.5 with fastcli's printable)
    from gpuwarden.ops.foundation.deadline import check_seconds
    options = options or {}
    env = os.environ if environ is None else environ
    errors: list[GpuwardenError] = []
    got: dict[str, object] = {}
    where: dict[str, str | None] = {}
    for k in keys.section("global").values():
        got[k.name], where[k.name] = _given(options, env, k)

    backend = got["backend"]
    choices = keys.key("global", "backend").choices
    if backend is not None and backend not in choices:
        errors.append(GpuwardenError(f"unknown backend {backend!r}", f"choose one of: {', '.join(keys.BACKENDS)}"))
        backend = None
    timeout = got["read_timeout"]
    if timeout is None:
        timeout = keys.default("global", "read_timeout")
    elif isinstance(timeout, str):  # the fast path hands the word over as typed, the environment always
        try:
            timeout = float(timeout)
        except ValueError:
            if where["read_timeout"] == "GPUWARDEN_READ_TIMEOUT":
                errors.append(GpuwardenError(f"GPUWARDEN_READ_TIMEOUT={timeout!r} is not a number of seconds",
                                             "e.g. GPUWARDEN_READ_TIMEOUT=3 (the default)"))
            else:
                errors.append(GpuwardenError(f"--read-timeout {timeout!r} is not a number of seconds",
                                             "e.g. --read-timeout 3 (the default)"))
            timeout = None
    if timeout is not None:
        try:
            timeout = check_seconds(float(timeout), "--read-timeout/GPUWARDEN_READ_TIMEOUT")  # type: ignore[arg-type]
        except GpuwardenError as exc:
            errors.append(exc)
    for name in ("sysfs_root", "proc_root"):
        value = got[name]
        # A missing /proc tree would show every GPU process as gone and its VRAM as residual.
        if check and value is not None and not Path(str(value)).is_dir():
            errors.append(GpuwardenError(f"{keys.key('global', name).option} {value} is not a directory",
                                         "point it at a captured tree (or leave it out to read the live node)"))
    if errors:
        raise errors[0] if len(errors) == 1 else SettingsErrors(errors)

    # A config that does not read leaves the default; the command that loads the config says what is wrong.
    chosen = state_dir(options, env) or default_state_dir(env)
    host_root = Path(str(got["host_root"])) if got["host_root"] is not None else None

    def path(name: str) -> Path:
        value = got[name]
        return Path(str(value if value is not None else keys.default("global", name)))

    if host_root is not None:
        # The host's own /sys and /proc under its mount point; --sysfs-root/--proc-root do not mix with it.
        sysfs_root, proc_root = host_root / "sys", host_root / "proc"
    else:
        sysfs_root, proc_root = path("sysfs_root"), path("proc_root")
    settings = Settings(
        state_dir=chosen, config_path=config_path(options, env),
        backend=str(backend) if backend and backend != "auto" else None,
        sysfs_root=sysfs_root, proc_root=proc_root, host_root=host_root,
        dev_root=path("dev_root"), etc_root=path("etc_root"), boot_root=path("boot_root"), opt_root=path("opt_root"),
        read_timeout_s=float(timeout),  # type: ignore[arg-type]
    )
    if check:
        statedir.check(settings.state_dir)  # not ours, shared with other users, unreadable: one line, now
    return settings


def kubernetes_config(settings: Settings, **overrides: Any) -> KubernetesConfig:
    """The [kubernetes] section as the agent runs it: table defaults < node config < command line (`overrides`,
    None for an option not given)."""
    # deferred: keeps `gpuwarden status --json` cheap (6.7 ms there)
    from dataclasses import replace

    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (25.1 ms there)
    from gpuwarden.ops.config import nodeconfig
    # status reads node.toml: only a node with a [kubernetes] table pays for that code
    # deferred: keeps `gpuwarden status --json` cheap (14.7 ms there)
    from gpuwarden.ops.config.kubernetes import KubernetesConfig
    cfg = KubernetesConfig()
    if settings.config_path.exists():
        cfg = nodeconfig.load(settings).kubernetes or cfg
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


def agent_config(settings: Settings, **overrides: Any) -> AgentConfig:
    """The [agent] section as the agent runs it: table defaults < node config < command line (`overrides`,
    None for an option not given)."""
    # deferred: keeps `gpuwarden status --json` cheap (6.7 ms there)
    from dataclasses import replace

    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (25.1 ms there)
    from gpuwarden.ops.config import nodeconfig
    # deferred: keeps `gpuwarden status --json` answered by the agent cheap (13.7 ms there)
    from gpuwarden.ops.config.agent import DEFAULT
    cfg = nodeconfig.load(settings).agent if settings.config_path.exists() else DEFAULT
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})

