"""The fix step of Kubernetes remediation (ops/services/k8s_remediation.py): the fix playbook, run as a person would run
`gpuwarden fix N --yes`, with the same locks, re-checks and journal, its result said in one line.
"""

from __future__ import annotations

import threading

from gpuwarden.ops.services.k8s_remediation import Fixer, FixOutcome
from gpuwarden.ops.foundation.settings import Settings

from gpuwarden.playbooks.fix import FixPlaybook
from gpuwarden.playbooks.framework import run


def fixer(settings: Settings, *, lock_wait_s: float = 30.0) -> Fixer:
    """A Fixer for the Remediator: purge -> (reset -> verify only if needed) on one GPU."""

    def fix(gpu: int, cancelled: threading.Event) -> FixOutcome:
        result = run(FixPlaybook(gpu), settings, assume_yes=True, lock_wait_s=lock_wait_s, cancelled=cancelled)
        done = next((e.message for e in reversed(result.events) if e.kind == "done"), "")
        if result.ok:
            return FixOutcome(True, done or f"GPU {gpu} is clean and verified")
        if result.refused:
            return FixOutcome(False, f"refused: {result.refused}")
        failed = next((e.message for e in reversed(result.events) if e.kind == "step_failed"), done)
        return FixOutcome(False, f"step {result.failed_step} failed: {failed}")
    return fix
