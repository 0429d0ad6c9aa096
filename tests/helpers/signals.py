"""Children that see the signals an operator sends: a suite started as a background job (nohup, `&` in a
script, some CI runners) hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt.
"""

from __future__ import annotations

import signal


def default_signals() -> None:
    """preexec_fn for a child under test: SIGINT, SIGTERM and SIGHUP back to their defaults."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
