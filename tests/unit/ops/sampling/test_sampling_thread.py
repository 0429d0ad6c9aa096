"""The sampling thread's wait: refresh_now and stop cut an interval short at once, a wake that comes during a
call is not lost, and several wakes during a call make one more call, not several."""

from __future__ import annotations

import contextlib
import threading

from gpuwarden.ops.sampling.thread import SamplingThread


class Source:
    def __init__(self) -> None:
        self.calls = 0
        self.cond = threading.Condition()
        self.gate: threading.Event | None = None  # while set to an Event, a call waits on it
        self.entered = threading.Event()  # a call is waiting on the gate

    def __call__(self):
        gate = self.gate
        if gate is not None:
            self.entered.set()
            gate.wait(30)
        with self.cond:
            self.calls += 1
            self.cond.notify_all()
        return object()

    def wait_calls(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.calls >= n, timeout=30), f"{self.calls} calls, waited for {n}"


@contextlib.contextmanager
def _running(source: Source):
    """A sampling thread on `source` with an hour-long interval; stopped at the end, which must end it at once."""
    t = SamplingThread(source, 3600.0, lambda snap: None, lambda message: None, min_interval=0.0)
    t.start()
    try:
        yield t
    finally:
        t.stop()
    assert t.join(30), "the thread outlived stop() in an hour-long wait"


def test_refresh_now_cuts_an_hour_long_wait_short_and_stop_ends_the_thread():
    source = Source()
    with _running(source) as t:
        source.wait_calls(1)
        t.refresh_now()
        source.wait_calls(2)


def test_a_wake_during_a_call_is_kept_and_three_wakes_make_one_more_call():
    source = Source()
    with _running(source) as t:
        source.wait_calls(1)
        gate = source.gate = threading.Event()
        t.refresh_now()  # call 2, which waits on the gate
        assert source.entered.wait(30)
        for _ in range(3):
            t.refresh_now()  # during call 2: they make one pending wake
        source.gate = None
        gate.set()
        source.wait_calls(3)  # the kept wake: call 3 comes without waiting out the hour
        with source.cond:  # and no fourth (an absence has no condition to wait for: half a second of it)
            assert not source.cond.wait_for(lambda: source.calls >= 4, timeout=0.5)
