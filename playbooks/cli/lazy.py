"""A Typer group whose commands are imported only when a command line names them (Click's lazy-loading pattern).

`gpuwarden fix 1` imports fix.py and no other command module; `--help` and shell completion load them all.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import typer
from typer.core import TyperGroup

from gpuwarden.playbooks.cli.summaries import summarise

# name -> ("module:attribute", kind). kind "group": the attribute is a Typer used as a whole (engines, arena);
# kind "command": the attribute is a Typer holding that command among others of one module (drain, undrain).
Lazy = dict[str, tuple[str, str]]


class LazyGroup(TyperGroup):
    """Commands named in `lazy` are imported on first use; anything added the usual way works as before.

    Every number option a loaded command has refuses nan and inf, and an interrupt leaves as KeyboardInterrupt
    (typer would turn it into a silent exit 130 before the CLI's own handler sees it)."""

    table: Lazy = {}
    nested: dict[str, Lazy] = {}  # more lazy commands for a lazy group of this one (the console's `fleet tui`)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy: Lazy = dict(self.table)

    @classmethod
    def with_commands(cls, table: Lazy, nested: dict[str, Lazy] | None = None) -> type[LazyGroup]:
        """A LazyGroup class for one command line (Typer makes the group from a class, not an instance)."""
        return type(cls.__name__, (cls,), {"table": dict(table), "nested": dict(nested or {})})

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(name for name in self.lazy if name not in self.commands)]

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in self.commands and name in self.lazy:
            command = load(name, *self.lazy[name])
            if isinstance(command, LazyGroup) and self.nested.get(name):
                command.lazy.update(self.nested[name])
            self.add_command(command, name)
        command = super().get_command(ctx, name)
        if command is not None:
            # The root is "gpuwarden"; a lazy group under it (fleet) lists its commands as "fleet tui".
            summarise(name if self.name in (None, "gpuwarden") else f"{self.name} {name}", command)
        return command

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Interrupted(exc) from None


def load(name: str, target: str, kind: str) -> Any:
    """The Click command `name` from `module:attribute`, ready to run."""
    module_name, attr = target.split(":")
    holder = getattr(importlib.import_module(module_name), attr)
    group = typer.main.get_group(holder)
    command = group if kind == "group" else group.commands[name]
    refuse_non_finite(command)
    return command


def refuse_non_finite(command: Any) -> None:
    """Each number option refuses nan and inf: `--timeout nan` compares false with any bound, so it would pass
    min=/max= and then never time out. Click has no hook after conversion but the parameter's process_value."""
    for param in getattr(command, "params", ()):
        if getattr(param, "_finite", False):
            continue
        inner = param.process_value

        def process_value(ctx: Any, value: Any, inner: Any = inner, param: Any = param) -> Any:
            value = inner(ctx, value)
            if isinstance(value, float) and not math.isfinite(value):
                raise typer.BadParameter(f"{value!r} is not a finite number", ctx=ctx, param=param)
            return value
        param.process_value = process_value
        param._finite = True
    for sub in getattr(command, "commands", {}).values():
        refuse_non_finite(sub)


class Interrupted(Exception):
    """An interrupt on its way out past typer (which would swallow a KeyboardInterrupt)."""

    def __init__(self, interrupt: KeyboardInterrupt):
        super().__init__(str(interrupt))
        self.interrupt = interrupt
