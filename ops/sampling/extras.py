"""The node extras beside attribution: idle baseline, drained GPUs, engines, arenas and the node config.

NodeExtras owns what makes them cheap to ask for every second (a FileCache of state files and the
config, the arena scan cadence); a broken state file or config becomes a warning, never a failed refresh.
"""

from __future__ import annotations

import os

from gpuwarden.ops.node import nodestate
from gpuwarden.ops.foundation import statedir
from gpuwarden.ops.foundation.dirwatch import DirWatch
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
        self._refreshes = 0
        self._watch: DirWatch | None = None  # the state dir's and the config's directories, from the 2nd refresh
        self._fixed: tuple[Any, ...] | None = None  # _read_fixed's last answer
        self._plain: Extras | None = None  # the last extras of a node without engines or arenas (see sample)
        self._fixed_files = frozenset(str(p) for p in (settings.state_dir / statedir.BASELINE,
                                                        settings.state_dir / statedir.DRAINED, settings.config_path))

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
        self._refreshes += 1
        if self._refreshes == 2 and self._watch is None and not settings.replay:
            # A sampler that refreshes again lives on (the agent, the console): from now on the state files and
            # the config are read only when their directories say something changed. One-shot `status` never
            # gets here, so it pays nothing for the watch.
            self._watch = DirWatch(self._watched_dirs())
        fixed = self._fixed
        if fixed is None or self._watch is None or self._watch.changed():
            fixed = self._fixed = self._read_fixed()
        elif self._plain is not None:
            return self._plain  # no engines, no arena, nothing changed: the last refresh's extras, as they were
        baseline, baseline_problem, drained, arena_path, engines_dir, fixed_warnings = fixed
        warnings = list(fixed_warnings)
        engines: tuple[EngineInfo, ...] = ()
        arenas: tuple[ArenaInfo, ...] = ()
        if self.with_engines and engines_dir:
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
        # The state files a quiet refresh did not ask for are still current: keep their parsed values.
        keep = self._fixed_files if self._watch is not None else frozenset()
        self.files.sweep(keep | self._engine_watch.files() if self._engine_watch is not None else keep)
        extras = Extras(baseline=baseline, baseline_problem=baseline_problem, drained=drained, engines=engines,
                        arenas=arenas, warnings=tuple(warnings))
        # A node with neither engines nor an arena: until the watched directories change, nothing here can.
        plain = (self._watch is not None and not engines_dir and arena_path is None and not engines and not arenas
                 and self._engine_watch is None and self._arenas is None)
        self._plain = extras if plain else None
        return extras

    def _read_fixed(self) -> tuple[Any, ...]:
        """What only a change in the state dir or the config's directory can change: the baseline, the drained
        GPUs, the configured arena and whether there is an engines directory, with their warnings."""
        settings = self.settings
        warnings: list[SnapshotWarning] = []
        baseline, baseline_problem = nodestate.baseline_or_warning(settings.state_dir, self.files)
        drained_gpus, drained_problem = nodestate.drained_or_warning(settings.state_dir, self.files)
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
        engines_dir = os.path.isdir(os.path.join(settings.state_dir, statedir.ENGINES))
        return (baseline, bool(baseline_problem), tuple(sorted(drained_gpus)), arena_path, engines_dir,
                tuple(warnings))

    def _watched_dirs(self) -> list[str]:
        config = self.settings.config_path
        dirs = [str(self.settings.state_dir), os.path.dirname(os.path.abspath(config))]
        real = os.path.realpath(config)
        if os.path.dirname(real) not in dirs:
            dirs.append(os.path.dirname(real))  # a config that links elsewhere (a ConfigMap's ..data) changes there
        return dirs

    def close(self) -> None:
        """Let go of the shims' pidfds (the engine watch's) and the state dir's watch."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None
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
