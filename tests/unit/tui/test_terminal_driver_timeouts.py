"""The quiet driver sleeps for ever only while Textual's parser awaits no timeout: a lone ESC (the Escape key, or
the start of a sequence) makes it wake when the parser would give up waiting, as Textual's 10 Hz ticks did."""

from __future__ import annotations

from textual._xterm_parser import XTermParser

from gpuwarden.tui import terminal_driver


def test_asleep_for_ever_with_nothing_pending_and_until_the_escape_timeout_after_a_lone_esc():
    parser = XTermParser(False)
    assert terminal_driver._poll_ms(parser) is None
    list(parser.feed("a"))
    assert terminal_driver._poll_ms(parser) is None  # a whole key: nothing to time
    list(parser.feed("\x1b"))
    due = terminal_driver._poll_ms(parser)
    assert due is not None and 0 <= due <= 1000, due  # Textual holds a lone ESC back a moment


def test_a_parser_without_the_attribute_gets_textuals_own_cadence():
    class Other:
        pass
    assert terminal_driver._poll_ms(Other()) == int(terminal_driver.LOOK_S * 1000)  # type: ignore[arg-type]
