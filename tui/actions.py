"""The TUI's actions: key, title, target and how to build the same playbook object the CLI runs.

Playbook modules are imported at the first key press, so the console starts without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks.framework import Playbook
from gpuwarden.ops.config import nodeconfig
from gpuwarden.ops.engines import control
from gpuwarden.playbooks.baseline import BaselinePlaybook
from gpuwarden.playbooks.bundle import BundlePlaybook
from gpuwarden.playbooks.drain import DrainPlaybook, UndrainPlaybook
from gpuwarden.playbooks.fix import FixPlaybook
from gpuwarden.playbooks.launch import LaunchPlaybook
from gpuwarden.playbooks.purge import PurgePlaybook
from gpuwarden.playbooks.reset import ResetPlaybook
from gpuwarden.playbooks.restart import RestartEnginePlaybook
from gpuwarden.playbooks.stop import StopEnginePlaybook


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

    def title_for(self, target: Target) -> str:
        """"Fix GPU 2", "Purge residual holders on GPU 2", "Stop engine dp0", "Launch engines"."""
        if self.needs == "gpu":
            if self.title.endswith(" GPU"):
                return f"{self.title} {target.gpu}"
            return f"{self.title} on GPU {target.gpu}"
        if self.needs == "engine":
            return f"{self.title} {target.engine}"
        return self.title

    @property
    def short(self) -> str:
        """The footer's word for it."""
        return self.name.capitalize()


def _launch(settings: Settings, target: Target) -> Playbook:
    config = nodeconfig.load(settings)
    # Launch what the config lists and nothing supervises yet: one key brings the node back to full.
    engines = tuple(e for e in config.engines if not control.supervised(settings, e.name))
    return LaunchPlaybook(config=config, engines=engines, stagger=config.stagger.slots)


def _stop(settings: Settings, target: Target) -> Playbook:
    return StopEnginePlaybook(engine=target.engine or "", gpu=target.engine_gpu)


def _restart(settings: Settings, target: Target) -> Playbook:
    return RestartEnginePlaybook(target.engine or "", target.engine_gpu)


def _fix(settings: Settings, target: Target) -> Playbook:
    return FixPlaybook(target.gpu)


def _drain(settings: Settings, target: Target) -> Playbook:
    return DrainPlaybook(target.gpu)


def _undrain(settings: Settings, target: Target) -> Playbook:
    return UndrainPlaybook(target.gpu)


def _reset(settings: Settings, target: Target) -> Playbook:
    return ResetPlaybook(target.gpu)


def _purge(settings: Settings, target: Target) -> Playbook:
    return PurgePlaybook(target.gpu)


def _baseline(settings: Settings, target: Target) -> Playbook:
    # Every GPU, as `gpuwarden baseline record` without --gpu: an idle baseline is a node-wide fact.
    return BaselinePlaybook(None)


def _bundle(settings: Settings, target: Target) -> Playbook:
    return BundlePlaybook()


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("launch", "l", "Launch engines", "start the node config's engines that are not running", "node", _launch),
    ActionSpec("stop", "s", "Stop engine", "stop the selected engine through its shim", "engine", _stop),
    ActionSpec("restart", "r", "Restart engine", "start the selected engine again from its spec (a crashed one "
               "too)", "engine", _restart),
    ActionSpec("fix", "f", "Fix GPU", "purge the selected GPU's residual holders, reset it only if needed, verify",
               "gpu", _fix),
    ActionSpec("drain", "d", "Drain GPU", "stop the selected GPU's engines and keep new ones off it", "gpu", _drain),
    ActionSpec("undrain", "u", "Undrain GPU", "put the selected GPU back in service", "gpu", _undrain),
    ActionSpec("reset", "R", "Reset GPU", "reset the selected (drained) GPU and verify it comes back empty", "gpu",
               _reset),
    ActionSpec("purge", "P", "Purge residual holders", "remove the processes that hold the selected GPU's residual VRAM",
               "gpu", _purge),
    ActionSpec("baseline", "b", "Record idle baseline", "record every GPU's idle VRAM as the residual baseline",
               "node", _baseline),
    ActionSpec("bundle", "B", "Collect incident bundle", "collect logs, state and triage into one bundle file",
               "node", _bundle),
)


def by_name(name: str) -> ActionSpec:
    return next(a for a in ACTIONS if a.name == name)
