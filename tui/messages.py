"""Messages that threads post to the app: a new snapshot, a failed sample, playbook progress and its end.

Textual's post_message is thread-safe, so the sampler and playbook threads only ever post these.
"""

from __future__ import annotations

from textual.message import Message

from gpuwarden.ops.foundation.model import NodeSnapshot


class SnapshotArrived(Message):
    def __init__(self, snapshot: NodeSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class SamplingFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class PlaybookProgress(Message):
    def __init__(self, run, event) -> None:
        super().__init__()
        self.run = run
        self.event = event


class PlaybookFinished(Message):
    def __init__(self, run) -> None:
        super().__init__()
        self.run = run
