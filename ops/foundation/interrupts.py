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


def ctrl_c_only(exc: BaseException) -> None:
    """For a command whose normal end is Ctrl-C (`status --watch`, `journal --follow`): return for Ctrl-C, re-raise
    SIGTERM and SIGHUP, which then exit 143 and 129 as every command's do (issue 36: a watch ended by SIGTERM
    exited 0)."""
    if isinstance(exc, Interrupted):
        raise exc


def signal_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: SIGINT unless it was one of ours."""
    return getattr(exc, "signum", signal.SIGINT)


def describe(exc: BaseException) -> str:
    """'interrupted' for Ctrl-C, 'ended by SIGTERM' for the others."""
    sig = signal_of(exc)
    return "interrupted" if sig == signal.SIGINT else f"ended by {signal.Signals(sig).name}"


class Held:
    """SIGINT, SIGTERM and SIGHUP noted instead of raised, between hold() and release(): for a step that must
    not be cut in two (a rename that completes the work, and the report of it). Main thread only, where
    Python runs signal handlers; elsewhere it holds nothing."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self._saved: dict[int, object] = {}

    def _note(self, signum: int, frame: object) -> None:
        if self.pending is None:
            self.pending = signum

    def hold(self) -> None:
        # deferred: keeps `gpuwarden status --json` cheap (0.8 ms there)
        import threading
        if self._saved or threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, *HANDLED):
            before = signal.getsignal(sig)
            if before is signal.SIG_IGN:  # ignored (nohup): stays so
                continue
            self._saved[sig] = before
            signal.signal(sig, self._note)

    def release(self) -> int | None:
        """Put the handlers back; the signal that came meanwhile (None if none), not raised."""
        for sig, before in self._saved.items():
            signal.signal(sig, before)  # type: ignore[arg-type]
        self._saved.clear()
        return self.pending

    def raise_pending(self) -> None:
        """Release, then raise what the held signal would have raised (nothing if none came)."""
        sig = self.release()
        if sig is not None:
            self.pending = None
            raise KeyboardInterrupt() if sig == signal.SIGINT else Interrupted(sig)


def signal_name(text: str) -> str | None:
    """The canonical name of a signal written "SIGTERM", "term" or "TERM" (None when no such signal exists).

    The one parser of signal names: the node config's stop_signal, the canary's --crash-signal and the console's
    process actions all read names through it."""
    name = text.strip().upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name].name
    except KeyError:
        return None


def signal_number(text: str) -> int | None:
    """The number of a signal written as signal_name() reads it; None when no such signal exists."""
    name = signal_name(text)
    return None if name is None else int(signal.Signals[name])
