"""The phase follower (gpuwarden.ops.engines.progress) on the event sequences engines really produce.

A failed registration moves the engine to failed-registration and keeps it there whatever it prints next,
until a registration succeeds or it stops: the sequence that hung launch for 660 s (issue 25).
"""

from __future__ import annotations

from gpuwarden.ops.engines.progress import Progress
from gpuwarden.ops.foundation.model import FAILED_REGISTRATION
from gpuwarden.ops.foundation.status_protocol import StatusEvent


def ev(phase: str, ts: float = 1.0, **data) -> StatusEvent:
    return StatusEvent(phase=phase, ts=ts, data={"source": "preload", **data})


def test_a_failed_registration_is_not_registering_forever_nor_serving():
    p = Progress(None, "^serving", serving_when_registered=False)
    assert p.on_event(ev("registering", 1.0))
    assert p.on_event(ev("register-failed", 1.1, result=101))
    assert p.phase == FAILED_REGISTRATION and p.since[FAILED_REGISTRATION] == 1.1
    assert not p.on_line("serving")  # the engine ignored the error; its ready line changes nothing
    assert not p.on_event(ev("registering", 2.0))  # a retry under way is not a success either
    assert p.phase == FAILED_REGISTRATION and not p.registered
    assert p.on_event(ev("registered", 3.0))  # the retry succeeded: it was ready already, so it serves
    assert p.phase == "serving"


def test_without_a_ready_pattern_a_later_success_means_serving():
    p = Progress(None, None, serving_when_registered=True)
    p.on_event(ev("register-failed", 1.0))
    assert p.phase == FAILED_REGISTRATION
    p.on_event(ev("registered", 2.0))
    assert p.phase == "serving"


def test_a_serving_engine_whose_next_registration_fails_needs_attention_and_stopping_ends_it():
    p = Progress(None, None, serving_when_registered=True)
    p.on_event(ev("registered", 1.0))
    assert p.phase == "serving"
    assert p.on_event(ev("register-failed", 2.0))
    assert p.phase == FAILED_REGISTRATION
    assert p.on_event(ev("stopping", 3.0))
    assert p.phase == "stopping"
    assert not p.on_event(ev("register-failed", 4.0)) and p.phase == "stopping"


def test_an_unregistration_failure_is_not_a_failed_registration():
    p = Progress(None, None, serving_when_registered=True)
    p.on_event(ev("registered", 1.0))
    p.on_event(ev("unregister-failed", 2.0))
    assert p.phase == "serving"
