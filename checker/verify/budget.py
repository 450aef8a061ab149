"""--timeout covers building a query, not only solving it (issue 23: ``verify --requests 64 --depth 1 --timeout 2``
spent over 200 s in Python building the step's terms before z3 was asked anything).

The terms are built by the one step encoding (checker/smt/encode.py) in plain Python, with no natural place to
look at a clock, so ``within(seconds)`` arms a timer: when it fires while the block still runs, BuildTimeout is
raised in the thread that entered the block, at its next Python instruction (``PyThreadState_SetAsyncExc``).
Where that instruction is in z3's bindings it may surface as a ctypes ArgumentError (ctypes wraps what an
argument's conversion raises: taken as the timeout) or be dropped in a ``__del__`` (not printed; raised again
AGAIN_S later). One the block never saw is raised and caught when the block ends (``_disarm``).
The session being built is thrown away; the caller reports what it has (UNKNOWN, "no violation up to depth
K - 1"). The block is left with the exception raised or no exception pending, never one left to fire later."""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class BuildTimeout(BaseException):
    """The time limit passed while a query was being built (a BaseException, as KeyboardInterrupt: no
    ``except Exception`` on the way, in the encoding or in z3's bindings, may swallow it)."""


AGAIN_S = 0.25  # a BuildTimeout that something dropped anyway is raised again this often until the block ends


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Run the block; raise BuildTimeout in it once ``seconds`` have passed (at once if none are left)."""
    if seconds <= 0:
        raise BuildTimeout
    target = threading.get_ident()
    lock = threading.Lock()
    state = ["armed"]
    done = threading.Event()

    def fire() -> None:
        wait = seconds
        while not done.wait(wait):
            with lock:
                if state[0] == "done":
                    return
                state[0] = "fired"
                _set_async_exc(target, BuildTimeout)
            wait = AGAIN_S

    timer = threading.Thread(target=fire, name="batchcheck-build-budget", daemon=True)
    hook = sys.unraisablehook

    def unraisable(info) -> None:  # raised in a __del__ and dropped there: the timer raises it again
        if not isinstance(info.exc_value, BuildTimeout):
            hook(info)

    sys.unraisablehook = unraisable
    timer.start()
    fired = False
    try:
        yield
    except BuildTimeout:
        fired = True
    except ctypes.ArgumentError as exc:  # raised while ctypes converted an argument: it wraps it
        if "BuildTimeout" not in str(exc):
            raise
        fired = True
    finally:
        sys.unraisablehook = hook
        fired = _disarm(lock, state, done) or fired
    if fired:
        raise BuildTimeout


def _disarm(lock: threading.Lock, state: list[str], done: threading.Event) -> bool:
    """Stop the timer; whether it fired. A BuildTimeout it set that the block never saw is raised and caught
    here, never cleared with ``PyThreadState_SetAsyncExc(id, NULL)``: on CPython 3.11 that call leaves the
    interpreter's asynchronous-exception flag set with no exception behind it, and from then on any traced code
    (``sys.settrace``: Hypothesis's explain phase while it shrinks, coverage, debuggers) spins at its first
    function entry for ever (a test-suite run hung in a Hypothesis ``find()`` after an in-process verify)."""
    fired = False
    while True:
        try:
            with lock:
                fired = fired or state[0] == "fired"
                state[0] = "done"
            done.set()
            if fired:
                for _ in range(2):
                    _entry()  # a function's entry checks for a pending asynchronous exception: raised there
            return fired
        except BuildTimeout:  # the pending one, delivered in this cleanup
            fired = True


def _entry() -> None:
    """Nothing: calling it lets the interpreter raise an asynchronous exception still pending for this thread."""
