"""What the verbs' shells share (checker/cli.py and the modules of checker/commands): the progress display
(one line on a terminal, plain lines in a CI log) and the argument types that more than one verb reads."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from checker.errors import NumberRange
from checker.parallel import MAX_JOBS

# ----------------------------------------------------------------------------------------- numeric flags
# Every numeric flag is read by ``number`` (or ``arg_type``): checked like a file field when the command line
# is parsed (a finite number in a stated range, the range in the message), so NaN, infinity, zero,
# negatives and 2**63 never reach the arithmetic. The ranges below are the declared ones (docs/cli.md).
MAX_SECONDS = 7 * 24 * 3600.0  # --timeout, --time-budget, --fuzz-budget, --follow-idle-s: a week
MAX_STEP_MS = 3_600_000.0  # --step-ms: an hour per iteration
MAX_SEED = 2**32 - 1  # what numpy and Hypothesis take
MAX_TOKENS = 10_000_000  # checker.policy.MAX_TOKENS (the shell does not import the models)
MAX_COUNT = 1_000_000_000  # --limit and other counts of requests or milliseconds


def arg_type(convert: Callable[[str], Any], ok: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, keep it when ``ok``, else say what was expected
    (argparse then exits 2 with ``argument --FLAG: 'TEXT' (expected ...)``)."""
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except (ValueError, OverflowError):
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} (expected {expected})")
        return value
    return parse


def number(kind: type, low: float, high: float, *, low_open: bool = False, high_open: bool = False,
           unit: str = "") -> Callable[[str], Any]:
    """A numeric flag: ``kind`` (int or float), finite, ``low <= value <= high`` (``<`` where open)."""
    return flag_type(NumberRange(kind, low, high, low_open, high_open, unit))


def flag_type(allowed: NumberRange) -> Callable[[str], Any]:
    """The argparse type of a numeric flag whose range is declared elsewhere (e.g. import's own options)."""
    return arg_type(allowed.read, lambda value: value is not None, allowed.expected)


SECONDS = number(float, 0, MAX_SECONDS, low_open=True, unit="seconds")
STEP_MS = number(float, 0.001, MAX_STEP_MS, unit="ms")
SEED = number(int, 0, MAX_SEED)
SLOTS = number(int, 1, 256, unit="request slots")  # verify and diff --requests
DEPTH = number(int, 1, 10_000, unit="iterations")  # verify and diff --depth
JOBS = number(int, 1, MAX_JOBS, unit="processes")  # ci, diff and fleet --jobs
EXAMPLES = number(int, 1, 100_000_000)  # fuzz and diff --max-examples


def int_range(text: str) -> tuple[int, int]:
    """LOW:HIGH (or one integer N, read as N:N) for --prompt-range and --output-range: token counts with
    1 <= LOW <= HIGH <= MAX_TOKENS."""
    low, sep, high = text.partition(":")
    try:
        values = int(low), int(high if sep else low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} (expected LOW:HIGH, two integers)") from None
    if not 1 <= values[0] <= values[1] <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"{text!r} (expected LOW:HIGH token counts with 1 <= LOW <= HIGH <= "
                                         f"{MAX_TOKENS:,})")
    return values


def progress_lines_on() -> bool:
    """Whether progress lines go to a non-terminal stderr (a CI log): yes unless BATCHCHECK_PROGRESS=off."""
    return os.environ.get("BATCHCHECK_PROGRESS", "").strip().lower() != "off"


class TerminalProgress:
    """Progress on stderr. On a terminal: one line, redrawn in place. Otherwise (a CI log, a pipe): the
    verbs' progress messages are kept, and :meth:`heartbeat` prints a plain line, ``batchcheck: VERB running
    (T s): LATEST MESSAGE``, once a command has run LINE_AFTER_S seconds and then every LINE_EVERY_S seconds,
    for every verb (one that reports no progress message gets the line without it). BATCHCHECK_PROGRESS=off
    turns the lines off."""

    LINE_AFTER_S = 5.0
    LINE_EVERY_S = 10.0

    def __init__(self):
        self.started = 0.0
        self.shown = False
        self.latest = ""

    def __call__(self):
        if not sys.stderr.isatty():
            if not progress_lines_on():
                return None

            def note(message: str) -> None:  # printed by the heartbeat
                self.latest = message
            return note
        self.started = time.monotonic()

        def show(message: str) -> None:
            elapsed = time.monotonic() - self.started
            print(f"\r\033[K  ... {message} ({elapsed:.1f} s)", end="", file=sys.stderr, flush=True)
            self.shown = True
        return show

    def clear(self) -> None:
        if self.shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self.shown = False

    @contextmanager
    def heartbeat(self, verb: str) -> Iterator[None]:
        """While the block runs, plain progress lines on a non-terminal stderr (nothing on a terminal, where
        the one-line display is drawn, or with BATCHCHECK_PROGRESS=off)."""
        if sys.stderr.isatty() or not progress_lines_on():
            yield
            return
        stop, started = threading.Event(), time.monotonic()
        self.latest = ""

        def beat() -> None:
            wait = self.LINE_AFTER_S
            while not stop.wait(wait):
                latest = f": {self.latest}" if self.latest else ""
                print(f"batchcheck: {verb} running ({time.monotonic() - started:.0f} s){latest}", file=sys.stderr,
                      flush=True)
                wait = self.LINE_EVERY_S

        thread = threading.Thread(target=beat, name="batchcheck-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(1.0)


terminal_progress = TerminalProgress()


# ----------------------------------------------------------------------------------------- trace options
# simulate, fuzz --seed-trace, audit --trace, fleet and simulate --fleet read a trace the same way (docs/cli.md).
def token_bounds(text: str) -> tuple[int, ...]:
    try:
        bounds = tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        bounds = ()
    if not bounds or not all(1 <= b <= MAX_TOKENS for b in bounds):
        raise argparse.ArgumentTypeError(f"{text!r} (expected token bounds from 1 to {MAX_TOKENS:,} like 512,4096)")
    return bounds


MAX_WINDOW_S = 1e9  # --window: about 31 years of trace


def window_flag(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    try:
        window = float(start), float(end)
    except ValueError:
        window = (float("nan"), float("nan"))
    if not 0 <= window[0] < window[1] <= MAX_WINDOW_S:
        raise argparse.ArgumentTypeError(f"{text!r} (expected START:END in seconds with 0 <= START < END <= "
                                         f"{MAX_WINDOW_S:g})")
    return window


RATE_SCALE = number(float, 0, 1e6, low_open=True)


def trace_option_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", type=window_flag, metavar="START:END", help="only arrivals in this window (s from the first)")
    p.add_argument("--rate-scale", type=RATE_SCALE, default=1.0, metavar="X", help="replay at X times the load (default 1)")
    p.add_argument("--class-by-prompt", type=token_bounds, default=(), metavar="B1,B2,...",
                   help="classes by prompt-length bucket, e.g. 512,4096")
    p.add_argument("--class-column", metavar="NAME", help="class from this trace column (CSV) or field (JSONL)")


def trace_options_from(args: argparse.Namespace):
    from checker.traces import TraceOptions

    return TraceOptions(args.window, args.rate_scale, args.class_by_prompt, args.class_column)


def trace_options_for(args: argparse.Namespace, trace: str | None, flag: str):
    """The trace options; a usage error when they are given without the trace they apply to."""
    from checker.errors import UsageError

    options = trace_options_from(args)
    if trace is None and options != type(options)():
        raise UsageError(f"--window, --rate-scale, --class-by-prompt and --class-column need {flag}")
    return options
