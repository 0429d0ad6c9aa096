"""The node extras beside attribution: idle baseline, drained GPUs, engines, arenas and the node config.

NodeExtras owns what makes them cheap to ask for every second (a FileCache of state files and the
config, the arena scan cadence); a broken state file or config becomes a warning, never a failed refresh.
"""

from __future__ import annotations


from gpuwarden.ops.node import nodestate
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.model import ArenaInfo, EngineInfo, SnapshotWarning
from gpuwarden.ops.foundation.records import record
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.foundation.filecache import FileCache

TYPE_CHECKING = False  # typing.TYPE_CHECKING without typing (~3 ms): every `status` samples through here
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from gpuwarden.ops.arena.watch import ArenaWatch
    from gpuwarden.ops.engines.watch import EngineWatch
    from gpuwarden.ops.config.nodeconfig import NodeConfig


@record
class Extras:
    baseline: dict[int, int]
    baseline_problem: bool  # a baseline file is there but corrupt (its warning says so; "none recorded" would mislead)
    drained: tuple[int, ...]
    engines: tuple[EngineInfo, ...]
    arenas: tuple[ArenaInfo, ...]
    warnings: tuple[SnapshotWarning, ...]


class NodeExtras:
    """Reads the extras of one node refresh after refresh. Not thread-safe: one per sampler."""

    def __init__(self, settings: Settings, *, with_engines: bool = True):
        self.settings = settings
        self.files = FileCache()
        self.with_engines = with_engines  # a bundle replay has no live engines or arenas to read
        self._arenas: ArenaWatch | None = None  # made at the first refresh that has something to watch
        self._engines: dict[str, Any] = {}  # list_engines' memo: an unchanged engine is the same EngineInfo again
        self._engine_watch: EngineWatch | None = None  # made at the first refresh with an engines directory

    def config(self) -> NodeConfig | None:
        """The node config (None when there is none); ConfigError when it does not load."""
        settings = self.settings

        def load(_path: Path) -> NodeConfig:
            # only with a config to read: status pays for nodeconfig (typing, tomllib) only then
            # deferred: keeps `gpuwarden status --json` cheap (21.2 ms there)
            from gpuwarden.ops.config import nodeconfig
            return nodeconfig.load(settings)
        config: NodeConfig | None = self.files.get(settings.config_path, load, "node-config")
        return config

    def sample(self) -> Extras:
        settings = self.settings
        warnings: list[SnapshotWarning] = []
        baseline, baseline_problem = nodestate.baseline_or_warning(settings.state_dir, self.files)
        drained_gpus, drained_problem = nodestate.drained_or_warning(settings.state_dir, self.files)
        drained = tuple(sorted(drained_gpus))
        warnings.extend(SnapshotWarning("state-file-corrupt", p) for p in (baseline_problem, drained_problem) if p)
        arena_path: str | None = None
        if not settings.replay:
            try:
                config = self.config()
                arena_path = config.arena.path if config is not None and config.arena else None
            except GpuwardenError as exc:
                # The arena panel would just say "no arena configured": a typo in node.toml must be visible.
                warnings.append(SnapshotWarning(
                    "config-unusable", f"node config unusable, arena and launch settings ignored: {exc.message} "
                    "(see `gpuwarden config check`)"))
        engines: tuple[EngineInfo, ...] = ()
        arenas: tuple[ArenaInfo, ...] = ()
        if self.with_engines and (settings.state_dir / "engines").is_dir():
            try:
                watch = self._engine_watch
                if watch is None:
                    # the engine records' code loads only on a node that has engines
                    # deferred: keeps `gpuwarden status --json` cheap (0.5 ms there)
                    from gpuwarden.ops.engines.watch import EngineWatch
                    watch = self._engine_watch = EngineWatch(settings)
                engines = watch.engines(self.files, self._engines)
            except Exception as exc:  # a broken state file must not hide the GPUs
                warnings.append(SnapshotWarning("engine-state-unreadable", f"engine state unreadable: {exc}"))
        if self.with_engines:
            try:
                arenas = self._list_arenas(engines, arena_path)
            except Exception as exc:
                warnings.append(SnapshotWarning("arena-state-unreadable", f"arena state unreadable: {exc}"))
        self.files.sweep(self._engine_watch.files() if self._engine_watch is not None else frozenset())
        return Extras(baseline=baseline, baseline_problem=bool(baseline_problem), drained=drained, engines=engines,
                      arenas=arenas, warnings=tuple(warnings))

    def close(self) -> None:
        """Let go of the shims' pidfds (the engine watch's)."""
        if self._engine_watch is not None:
            self._engine_watch.close()
            self._engine_watch = None

    def _list_arenas(self, engines: tuple[EngineInfo, ...], arena_path: str | None) -> tuple[ArenaInfo, ...]:
        if arena_path is None and not any(e.pid for e in engines):
            return ()  # nothing configured, no engine to map one: skip importing the arena code at all
        if self._arenas is None:
            # the arena code (xxhash) loads only when an arena is configured or an engine maps one
            # deferred: keeps `gpuwarden status --json` through the sysfs backend cheap (8.7 ms there)
            from gpuwarden.ops.arena.watch import ArenaWatch
            self._arenas = ArenaWatch(self.settings)
        return tuple(self._arenas.arenas(engines, configured=arena_path))
