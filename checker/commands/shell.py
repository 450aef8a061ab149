"""What the verbs' shells share (checker/cli.py and the modules of checker/commands): the one-line progress
display and the argument types that more than one verb reads."""

from __future__ import annotations

import argparse
import sys


def int_range(text: str) -> tuple[int, int]:
    """LOW:HIGH (or one integer N, read as N:N) for --prompt-range and --output-range."""
    low, sep, high = text.partition(":")
    try:
        return int(low), int(high if sep else low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} (expected LOW:HIGH, two integers)") from None


class TerminalProgress:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self):
        self.started = 0.0
        self.shown = False

    def __call__(self):
        import time

        if not sys.stderr.isatty():
            return None
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


terminal_progress = TerminalProgress()
