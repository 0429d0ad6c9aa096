"""The command palette's gpuwarden commands: every action the keys offer, plus the views.

In read-only mode the actions are not offered at all, the same as their keys.
"""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


class GpuwardenCommands(Provider):
    def _commands(self) -> list[tuple[str, str, str]]:
        app = self.app
        return list(getattr(app, "palette_commands", lambda: [])())

    async def discover(self) -> Hits:
        for title, help_text, action in self._commands():
            yield DiscoveryHit(title, partial(self.app.run_action, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, action in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self.app.run_action, action), help=help_text)
