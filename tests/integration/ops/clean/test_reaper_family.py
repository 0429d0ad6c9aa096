"""Process families for reaper and purge tests: a subreaper, a parent that never reaps, and a tenant.

The machine's PID 1 may not reap orphans promptly, so the family's own subreaper plays init.
"""

from __future__ import annotations

import os
import signal
import time

from helpers.reaper_family import start_family
from helpers.simnode import proc_state, wait_for


def test_family_bad_parent_leaves_a_zombie():
    fam = start_family(["sleep", "30"])
    try:
        assert fam.parent != fam.keeper.pid
        os.kill(fam.tenant, signal.SIGKILL)
        assert wait_for(lambda: proc_state(fam.tenant) == "Z", 5)
        # The parent really does not reap: still a zombie a moment later.
        time.sleep(0.2)
        assert proc_state(fam.tenant) == "Z"
    finally:
        fam.stop()
