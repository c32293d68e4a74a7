"""The Ctrl-C latch: while attempts run, an interrupt is kept until the main thread acts on it,
and a second one while it does is kept for the session's close (main thread)."""

from __future__ import annotations

import concurrent.futures
import functools
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class InterruptLatch:
    """Ctrl-C while attempts run, kept until the main thread has acted on it (main thread).

    CPython runs a signal handler wherever the main thread happens to be, a finalizer included,
    and an exception raised in a finalizer is printed and dropped: a plain KeyboardInterrupt can
    be lost there while the run goes on to pay for every remaining case. This handler records the
    interrupt and has the attempts in flight cancelled, so a main thread blocked on one wakes,
    and `result` raises the interrupt again however the first one ended.

    The handler itself only sets a flag and hands the cancelling to another thread (`hand_off`,
    the loop's `call_soon_threadsafe`, which takes no lock). It may run while the main thread
    holds a lock, a progress counter's say, and cancelling a future runs its done-callbacks,
    one of which takes that same lock: cancelled in the handler, a Ctrl-C landing there
    deadlocked the run instead of stopping it.
    """

    def __init__(self) -> None:
        self.tripped = False
        self._previous: Any = None
        self._in_flight: Callable[[], list[concurrent.futures.Future[Any]]] = list
        self._hand_off: Callable[[Callable[[], None]], Any] = lambda call: call()
        self._again: Callable[[], None] = lambda: None

    def install(
        self,
        in_flight: Callable[[], list[concurrent.futures.Future[Any]]],
        hand_off: Callable[[Callable[[], None]], Any],
        again: Callable[[], None] | None = None,
    ) -> None:
        """Take SIGINT over from Python's default handler (only that one, only on the main
        thread: a handler the user or another plugin set stays theirs). `hand_off` runs a
        callable on another thread without taking a lock (the loop's `call_soon_threadsafe`);
        `again` is told of a Ctrl-C that comes once the first is being acted on."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        self._in_flight, self._hand_off = in_flight, hand_off
        self._again = again or self._again
        self._previous = signal.signal(signal.SIGINT, self._handle)

    def restore(self) -> None:
        """Give SIGINT back to the handler it had before `install`."""
        if self._previous is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) == self._handle:
            signal.signal(signal.SIGINT, self._previous)
        self._previous = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.tripped:
            # A double tap: raised, it broke into pytest's report of the first (a traceback,
            # status -2). Kept for the close instead, as `WriterClaims.hold_interrupts` keeps
            # one after this handler is gone: it ends the close's wait for other processes.
            self._again()
            return
        self.tripped = True
        # The list is taken here: the main thread may add to the dict once this returns.
        self._hand_off(functools.partial(_cancel_all, self._in_flight()))
        raise KeyboardInterrupt

    def result(self, future: concurrent.futures.Future[T]) -> T:
        """The future's result, or the interrupt if one came (even one a finalizer swallowed)."""
        if self.tripped:
            raise KeyboardInterrupt
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self.tripped:
                raise KeyboardInterrupt from None
            raise


def _cancel_all(futures: list[concurrent.futures.Future[Any]]) -> None:
    for future in futures:
        future.cancel()
