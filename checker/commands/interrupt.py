"""Ctrl-C stops a run even while z3 solves, and ``main`` leaves the process as it found it.

z3 takes SIGINT itself during a check and answers 'unknown' ("interrupted from keyboard"), and the run would go
on to report a verdict it never finished. So, while ``main`` runs a verb: z3's own handler is off (its global
``ctrl_c`` parameter), and a thread that the signal wakes (``signal.set_wakeup_fd``: written by Python's own
handler the moment the signal arrives) interrupts z3's check; Python's KeyboardInterrupt then reaches ``main`` as
soon as the check returns: one line, exit 130. A KeyboardInterrupt Python would drop (raised in a garbage
collector callback, which Hypothesis installs, or in a ``__del__``) is raised again.

All of it is installed for one call of ``main`` and taken down when it returns: the wakeup fd, the watching
thread, the unraisable hook and z3's parameter are as they were (an in-process caller, e.g. the test suite,
runs ``main`` many times). Only from the main thread, and only while SIGINT has Python's default handler (not
where it is ignored, e.g. a background job)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Verbs that run z3 in this process (ci's workers set themselves up: checker/ci/execute.py).
SOLVING_VERBS = frozenset({"verify", "recheck", "diff", "ci"})
REDELIVER_AFTER_S = 0.5
UNRAISED_AGAIN_S = 0.01


class Interrupts:
    """One ``main`` call's Ctrl-C state: whether main handled the KeyboardInterrupt, and the redelivery."""

    def __init__(self) -> None:
        self.handled = threading.Event()  # main's KeyboardInterrupt handler ran (or main returned)
        self.redelivering = threading.Event()
        self.redeliverer: threading.Thread | None = None
        self.timers: list[threading.Timer] = []

    def redeliver(self) -> None:
        """A KeyboardInterrupt raised while the main thread runs a garbage-collector callback is dropped by
        Python ("Exception ignored"), and the run would go on to its verdicts. The unraisable hook raises it
        again; should another path drop it, it is raised again in the main thread every REDELIVER_AFTER_S
        seconds until main has handled it (or returned)."""
        import _thread

        while not self.handled.wait(REDELIVER_AFTER_S):
            _thread.interrupt_main()


@contextmanager
def ctrl_c_stops_solving(verb: str) -> Iterator[Interrupts]:
    """While the block runs, Ctrl-C stops z3 too (see the module); everything is restored when it ends."""
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield state
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # someone else's: leave it
        signal.set_wakeup_fd(-1)
        os.close(read), os.close(write)
        yield state
        return

    ended = threading.Event()

    def watch() -> None:
        while True:
            chunk = os.read(read, 64)
            if ended.is_set():  # woken by the block's end (not by EOF: a forked worker may hold the write end)
                return
            if signal.SIGINT not in chunk:
                continue
            if "z3" in sys.modules:
                sys.modules["z3"].main_ctx().interrupt()  # the check returns; the KeyboardInterrupt follows
            if not state.redelivering.is_set():
                state.redelivering.set()
                state.redeliverer = threading.Thread(target=state.redeliver, name="batchcheck-ctrl-c-again",
                                                     daemon=True)
                state.redeliverer.start()

    watcher = threading.Thread(target=watch, name="batchcheck-ctrl-c", daemon=True)
    watcher.start()
    previous_hook = sys.unraisablehook

    def unraisable(info) -> None:  # a KeyboardInterrupt Python would drop: raised again once the callback returns
        if isinstance(info.exc_value, KeyboardInterrupt) and not state.handled.is_set():
            import _thread

            timer = threading.Timer(UNRAISED_AGAIN_S, _thread.interrupt_main)  # from another thread: not in here
            state.timers.append(timer)
            timer.start()
            return
        previous_hook(info)

    sys.unraisablehook = unraisable
    z3_ctrl_c = _solver_ctrl_c_off() if verb in SOLVING_VERBS else None
    try:
        yield state
    finally:
        state.handled.set()  # stops a redelivery under way
        signal.set_wakeup_fd(-1)
        ended.set()
        try:
            os.write(write, b"\0")  # wakes the watcher, which ends
        except BlockingIOError:  # the pipe is full: the watcher has bytes to read and wakes anyway
            pass
        watcher.join()
        os.close(write), os.close(read)
        for thread in [t for t in [state.redeliverer] if t is not None] + state.timers:
            thread.join()
        if state.redeliverer is not None or state.timers:
            try:  # one last redelivery, sent as main handled the first: taken here, not by main's caller
                _entry()
            except KeyboardInterrupt:
                pass
        if sys.unraisablehook is unraisable:
            sys.unraisablehook = previous_hook
        if z3_ctrl_c is not None:
            _solver_ctrl_c(z3_ctrl_c)


def _entry() -> None:
    """Nothing: calling it lets the interpreter run a signal handler still pending for the main thread."""


def _solver_ctrl_c_off() -> str:
    """z3 leaves SIGINT to Python (it would otherwise swallow it during a check); z3's setting before."""
    from checker.smt.ops import z3

    before = str(z3.get_param("ctrl_c"))
    z3.set_param("ctrl_c", False)
    return before


def _solver_ctrl_c(value: str) -> None:
    from checker.smt.ops import z3

    z3.set_param("ctrl_c", value == "true")
