"""The TUI's actions: key, title, target and how to build the same playbook object the CLI runs.

A playbook whose module has not landed in this build raises NotAvailable; the app shows that, never a crash.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ops.errors import GpuwardenError
from ops.settings import Settings
from playbooks.framework import Playbook


class NotAvailable(GpuwardenError):
    """The playbook behind an action is not part of this build."""


@dataclass(frozen=True)
class Target:
    """What the cursor points at when the key is pressed."""

    gpu: int | None = None
    engine: str | None = None
    engine_gpu: int | None = None


@dataclass(frozen=True)
class ActionSpec:
    name: str  # the App action is "act_<name>"
    key: str
    title: str
    help: str
    needs: str  # "gpu", "engine" or "node"
    build: Callable[[Settings, Target], Playbook]

    @property
    def short(self) -> str:
        """The footer's word for it."""
        return self.name.capitalize()


def _load(module: str, attr: str) -> Any:
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        raise NotAvailable(f"not available in this build ({module}.{attr} is missing)") from None


def _construct(cls: Any, *args: Any, **kwargs: Any) -> Playbook:
    try:
        return cls(*args, **kwargs)
    except TypeError as exc:
        raise NotAvailable(f"not available in this build ({cls.__name__} takes other arguments: {exc})") from None


def _launch(settings: Settings, target: Target) -> Playbook:
    LaunchPlaybook = _load("playbooks.launch", "LaunchPlaybook")
    from ops import nodeconfig
    from ops.engines import control
    config = nodeconfig.load(settings)
    # Launch what the config lists and nothing supervises yet: one key brings the node back to full.
    engines = tuple(e for e in config.engines if not control.supervised(settings, e.name))
    return _construct(LaunchPlaybook, config=config, engines=engines, stagger=config.stagger.slots)


def _stop(settings: Settings, target: Target) -> Playbook:
    from playbooks.stop import StopEnginePlaybook
    return StopEnginePlaybook(engine=target.engine or "", gpu=target.engine_gpu)


def _gpu_playbook(module: str, cls: str, **extra: Any) -> Callable[[Settings, Target], Playbook]:
    def build(settings: Settings, target: Target) -> Playbook:
        return _construct(_load(module, cls), target.gpu, **extra)
    return build


def _baseline(settings: Settings, target: Target) -> Playbook:
    # Every GPU, as `gpuwarden baseline record` without --gpu: an idle baseline is a node-wide fact.
    return _construct(_load("playbooks.baseline", "BaselinePlaybook"), None)


def _bundle(settings: Settings, target: Target) -> Playbook:
    return _construct(_load("playbooks.bundle", "BundlePlaybook"))


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("launch", "l", "Launch engines", "start the node config's engines that are not running", "node", _launch),
    ActionSpec("stop", "s", "Stop engine", "stop the selected engine through its shim", "engine", _stop),
    ActionSpec("drain", "d", "Drain GPU", "stop the selected GPU's engines and keep new ones off it", "gpu",
               _gpu_playbook("playbooks.drain", "DrainPlaybook")),
    ActionSpec("undrain", "u", "Undrain GPU", "put the selected GPU back in service", "gpu",
               _gpu_playbook("playbooks.drain", "UndrainPlaybook")),
    ActionSpec("reset", "R", "Reset GPU", "reset the selected (drained) GPU and verify it comes back empty", "gpu",
               _gpu_playbook("playbooks.reset", "ResetPlaybook")),
    ActionSpec("purge", "P", "Purge residual holders", "remove the processes that hold the selected GPU's residual VRAM",
               "gpu", _gpu_playbook("playbooks.purge", "PurgePlaybook")),
    ActionSpec("baseline", "b", "Record idle baseline", "record every GPU's idle VRAM as the residual baseline",
               "node", _baseline),
    ActionSpec("bundle", "B", "Collect incident bundle", "collect logs, state and triage into one bundle file",
               "node", _bundle),
)


def by_name(name: str) -> ActionSpec:
    return next(a for a in ACTIONS if a.name == name)
