"""A step interrupted by Ctrl-C (or SIGTERM) whose clean-up then fails is an interrupted run, not a failed step: the
exit status must say 130, not 1 (a drain interrupted in its wait once ended `OSError: [Errno 9] Bad file descriptor`)."""

from __future__ import annotations

import json

import pytest

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.foundation.interrupts import Interrupted
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.playbooks import framework
from gpuwarden.playbooks.framework import Playbook, Step


class _Waits(Playbook):
    name = "waits"

    def __init__(self, cleanup_error: BaseException | None, interrupt: KeyboardInterrupt) -> None:
        self.cleanup_error = cleanup_error
        self.interrupt = interrupt

    def gpus(self) -> tuple[int, ...]:
        return ()

    def preconditions(self, ctx) -> list[str]:
        return []

    def plan(self, ctx) -> list[Step]:
        return [Step("wait", "wait for the GPU", self._wait), Step("after", "never reached", lambda ctx: "ran")]

    def _wait(self, ctx) -> str:
        try:
            raise self.interrupt  # what the signal handler raises in the main thread mid-wait
        finally:
            if self.cleanup_error is not None:
                raise self.cleanup_error  # a close in the clean-up that fails while the interrupt unwinds


def _journal(state_dir) -> list[dict]:
    lines = []
    for path in sorted(state_dir.rglob("journal*")):
        if path.is_file():
            lines += [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return lines


@pytest.mark.parametrize("cleanup_error", [OSError(9, "Bad file descriptor"), GpuwardenError("cannot read"), None])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), Interrupted(15)], ids=["SIGINT", "SIGTERM"])
def test_a_failed_clean_up_during_an_interrupt_leaves_the_run_interrupted(tmp_path, cleanup_error, interrupt):
    settings = Settings(state_dir=tmp_path / "s")
    with pytest.raises(KeyboardInterrupt) as raised:
        framework.run(_Waits(cleanup_error, interrupt), settings, assume_yes=True)
    assert raised.value is interrupt  # the same signal: the exit status says which one
    entries = [(e["action"], e["result"]) for e in _journal(tmp_path / "s")]
    assert ("waits", "interrupted") in entries and ("waits:after", "ok") not in entries
    if cleanup_error is not None:  # and the clean-up's error is journalled, not lost
        failed = [e for e in _journal(tmp_path / "s") if e["action"] == "waits:wait"]
        assert failed and failed[0]["during"] == "interrupt" and str(cleanup_error) in failed[0]["error"]


def test_an_unexpected_error_journals_where_it_was_raised(tmp_path):
    class Buggy(_Waits):
        def _wait(self, ctx) -> str:
            return {}["missing"]

    result = framework.run(Buggy(None, KeyboardInterrupt()), Settings(state_dir=tmp_path / "s"), assume_yes=True)
    assert not result.ok and result.failed_step == "wait"
    failed = [e for e in _journal(tmp_path / "s") if e["action"] == "waits:wait"][0]
    assert failed["error"] == "KeyError: 'missing'"
    assert failed["where"].endswith("in _wait") and "test_framework_interrupt.py:" in failed["where"]
