"""A playbook key pressed in a remote node's console: the node runs its own playbook over the open SSH connection.

Same rules as a local run: a destructive playbook asks first (Cancel is the default) and only then runs with
--yes there; the node's own locks, checks and journal apply, and its JSON events fill the progress view.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.playbooks.fleet.actions import RemotePlaybook, command_line, event_from_dict
from gpuwarden.playbooks.framework import Event, Result

from gpuwarden.tui.messages import PlaybookFinished
from gpuwarden.tui.runner import PlaybookRun

if TYPE_CHECKING:
    from textual.app import App


class RemotePlaybookRun(PlaybookRun):
    """PlaybookRun's interface (title, events, result, running, start, cancel, join) for a remote node."""

    def __init__(self, app: "App", monitor, fleet_target, node: str, remote: RemotePlaybook, title: str):
        super().__init__(app, SimpleNamespace(name=remote.name), None, f"{title} on {node}")
        self.monitor = monitor
        self.target = fleet_target
        self.node = node
        self.remote = remote

    def _main(self) -> None:
        try:
            self.result = self._run()
        except GpuwardenError as exc:
            self._sink(Event("done", self.remote.name, None, exc.message, {"ok": False}))
            self.result = Result(ok=False, events=self.events, refused=exc.message)
        except Exception as exc:  # anything else must still end the run on screen
            self._sink(Event("done", self.remote.name, None, f"{type(exc).__name__}: {exc}", {"ok": False}))
            self.result = Result(ok=False, events=self.events, failed_step="(remote)")
        self.app.post_message(PlaybookFinished(self))

    def _run(self) -> Result:
        if self.remote.destructive and not self._confirm(f"{self.remote.title} on {self.node}. Proceed?"):
            self._sink(Event("done", self.remote.name, None, "cancelled by the operator", {"ok": False}))
            return Result(ok=False, events=self.events, refused="cancelled")
        data: dict = {}

        def line(text: str) -> None:
            try:
                obj = json.loads(text)
            except ValueError:
                return
            if isinstance(obj, dict) and "kind" in obj:
                self._sink(event_from_dict(obj))
            elif isinstance(obj, dict) and obj.get("path"):  # `bundle --json` answers with its result
                data["bundle"] = obj["path"]
                self._sink(Event("done", self.remote.name, None, f"bundle written on {self.node}: {obj['path']}",
                                 {"ok": True}))
        future = self.monitor.run_remote(self.node, command_line(self.target, self.remote, dry_run=False), line)
        status, stderr = future.result()
        if not any(e.kind == "done" for e in self.events):
            last = (stderr.strip().splitlines() or [f"exited {status}"])[-1]
            self._sink(Event("done", self.remote.name, None, last, {"ok": status == 0}))
        # The bundle stays on the node: its path is not a file here, so t (triage) must not try to open it.
        return Result(ok=status == 0, events=self.events, failed_step=None if status == 0 else "(remote)",
                      data={"remote_bundle": data["bundle"]} if "bundle" in data else {})
