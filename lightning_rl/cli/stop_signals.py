"""A command stopped by a signal keeps what it finished: SIGTERM (a scheduler's stop) and SIGINT (Ctrl-C).

``record`` plays episodes for minutes or hours; when it is stopped, the episodes that ended
are still worth writing. Inside :func:`stop_on_sigterm`, SIGTERM raises :class:`Stopped` in the
main thread, as Ctrl-C raises ``KeyboardInterrupt``; the command catches both, saves what it
has, and exits with status ``128 + signal`` (as a shell reports a process the signal ended),
so a scheduler tells a stopped run from a finished one. A second SIGTERM while
it saves ends the process at once (the default action is back).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Stopped(BaseException):
    """SIGTERM arrived inside :func:`stop_on_sigterm`.

    A ``BaseException``, as ``KeyboardInterrupt`` is: the code it interrupts (an env's step
    inside the env-fault guards, which turn an ``Exception`` into an env error) lets it through.

    Attributes:
        signum: The signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Raise :class:`Stopped` in the main thread on the first SIGTERM in the block; the next one ends the process.

    Outside the main thread (where Python cannot set signal handlers) the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the process
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_signal(stop: Stopped | KeyboardInterrupt) -> signal.Signals:
    """The signal ``stop`` stands for: SIGTERM's (or another's) :class:`Stopped`, or Ctrl-C's SIGINT."""
    return signal.Signals(stop.signum if isinstance(stop, Stopped) else signal.SIGINT)

