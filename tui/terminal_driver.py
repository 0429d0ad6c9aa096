"""Textual's Linux terminal driver with an input thread that sleeps until a key, a mouse event or a stop.

Textual's own thread wakes ten times a second to look at its exit flag and the parser's timeouts: in an idle console
on the stand-in NVML node that was 1.5 ms of CPU a second, more than the main thread's drawing (issue 38).
"""

from __future__ import annotations

import os
import select
import threading
from codecs import getincrementaldecoder
from typing import Any

import textual
from textual.drivers.linux_driver import LinuxDriver

from gpuwarden.ops.foundation.waitfd import WakePipe

try:  # Textual's private modules: a release that moved them gets Textual's own driver (fits() says no)
    from textual._time import get_time
    from textual._xterm_parser import XTermParser
    _PRIVATES = True
except ImportError:
    _PRIVATES = False

# Where Textual's parser keeps the moment a partial sequence (a lone ESC: the Escape key) times out, None while it
# awaits none. A Textual release that names it otherwise gets Textual's own cadence, LOOK_S.
_PARSER_DUE = "_timeout_time"
LOOK_S = 0.1
_UNKNOWN = object()
# The Textual releases whose LinuxDriver.run_input_thread this one stands in for (read against each): another
# release gets Textual's own driver until its input thread has been read again and the release added here.
TEXTUAL_READ = ("8.",)


def fits() -> bool:
    """Whether the installed Textual is one whose input thread this driver was written against."""
    return _PRIVATES and textual.__version__.startswith(TEXTUAL_READ)


def _poll_ms(parser: XTermParser) -> int | None:
    """How long the input thread may sleep: until the parser's timeout is due, for ever when it awaits none."""
    due = getattr(parser, _PARSER_DUE, _UNKNOWN)
    if due is None:
        return None
    if isinstance(due, float):
        return max(0, int((due - get_time()) * 1000) + 1)
    return int(LOOK_S * 1000)


class QuietLinuxDriver(LinuxDriver):
    """LinuxDriver whose input thread polls the terminal and a wake pipe, with no timeout unless the parser awaits
    one. Textual's disable_input() sets the exit flag and joins the thread; this one writes the pipe first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Not drained until the next input thread starts (a suspend and resume starts a new one), so a wake-up
        # written a moment before the exit flag is set keeps the thread looking until it is.
        self._wake = WakePipe()

    def run_input_thread(self) -> None:
        """Read the terminal and hand Textual its events, as Textual's own thread does, asleep in between."""
        _name_this_thread(b"textual-input")
        self._wake.drain()
        fileno = self.fileno
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        poller = select.poll()
        poller.register(fileno, select.POLLIN)
        poller.register(self._wake.fd, select.POLLIN)
        exit_event = self.exit_event
        while not exit_event.is_set():
            ready = poller.poll(_poll_ms(parser))
            if any(fd == fileno for fd, _ in ready):
                try:
                    data = os.read(fileno, 4096)
                except OSError:  # the terminal hung up (EIO) or was closed: SIGHUP ends the console
                    break
                if not data:
                    break  # end of input (stdin a pipe, not a terminal): nothing more will come
                for event in parser.feed(decode(data)):
                    self.process_message(event)
            elif ready:
                exit_event.wait(0.01)  # woken to stop: Textual sets the flag right after the pipe is written
            for event in parser.tick():
                self.process_message(event)

    def disable_input(self) -> None:
        if not self.exit_event.is_set():
            self._wake.wake()
        super().disable_input()


def _name_this_thread(name: bytes) -> None:
    """Give the calling thread its name in the kernel too, as top -H shows it (Python before 3.14 names threads for
    itself only); written through /proc, which takes a thread's own name (fs/proc/base.c, comm_write)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "wb") as f:
            f.write(name[:15])
    except OSError:  # no /proc (not Linux): the name is a convenience
        pass
