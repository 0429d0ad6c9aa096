"""SIGTERM and SIGHUP handled like Ctrl-C: every long command unwinds through the same cleanup.

install() makes both raise Interrupted (a KeyboardInterrupt) in the main thread, so the finally blocks
that remove a partial arena, kill a bundle's vendor tools or journal an interrupted playbook run for
all three; the exit status says which signal it was (128 + its number).
"""

from __future__ import annotations

import signal

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP; `signum` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def install() -> None:
    """From now on SIGTERM and SIGHUP interrupt like Ctrl-C; a signal inherited as ignored (nohup) stays so."""
    for sig in HANDLED:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _raise)


def signal_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: SIGINT unless it was one of ours."""
    return getattr(exc, "signum", signal.SIGINT)


def describe(exc: BaseException) -> str:
    """'interrupted' for Ctrl-C, 'ended by SIGTERM' for the others."""
    sig = signal_of(exc)
    return "interrupted" if sig == signal.SIGINT else f"ended by {signal.Signals(sig).name}"
