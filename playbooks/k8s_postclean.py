"""The clean step of the agent's post-clean (ops/services/k8s_tenantclean.py): the fix playbook run unattended on the GPU a
tenant left, purging what holds it and resetting only when the agent found the reset reaches nothing in use.
"""

from __future__ import annotations

import threading

from gpuwarden.ops.services.k8s_remediation import FixOutcome
from gpuwarden.ops.services.k8s_tenantclean import Cleaner
from gpuwarden.ops.foundation.settings import Settings

from gpuwarden.playbooks.k8s_remediate import fix_once


def cleaner(settings: Settings, *, lock_wait_s: float = 30.0) -> Cleaner:
    """A Cleaner: `gpuwarden fix N --yes`, with --no-reset unless the agent allowed the reset for this GPU."""

    def clean(gpu: int, may_reset: bool, cancelled: threading.Event) -> FixOutcome:
        return fix_once(settings, gpu, cancelled, allow_reset=may_reset, lock_wait_s=lock_wait_s)
    return clean
