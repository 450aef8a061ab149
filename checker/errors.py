"""The one exception root of batchcheck, and the message shape every input error uses.

An input error names the file, the field path (and line where known), the value given and what is
allowed, in the form ``file:line: path=value (expected ...)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from checker.exitcodes import ExitCode


class BatchcheckError(Exception):
    """Root of every error batchcheck raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL_ERROR


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is, what was given, what is allowed."""

    path: str  # dotted field path, e.g. "batch.max_num_seqs"; "" for the whole document
    value: object  # the value given (already shortened for display by the caller if huge)
    expected: str  # what is allowed, phrased to follow "expected "
    line: int | None = None  # 1-based line in the file, where known

    def render(self, source: str | None) -> str:
        """``file:line: path=value (expected ...)``; without a file (a command-line flag), no prefix."""
        name = self.path or "(document)"
        text = f"{name}={_show(self.value)} (expected {self.expected})"
        if source is None:
            return text
        where = source if self.line is None else f"{source}:{self.line}"
        return f"{where}: {text}"


def _show(value: object) -> str:
    if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
        return value  # a placeholder such as <missing>, shown as is
    text = repr(value) if isinstance(value, str) else str(value)
    if isinstance(value, (dict, list)):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class NumberRange:
    """What a numeric flag allows: a finite ``kind`` (int or float) from ``low`` to ``high`` (bounds excluded
    where open). The one check of every numeric flag (checker/commands/shell.py ``number``, import's own
    options), so that NaN, infinity, zero, negatives and 2**63 never reach the arithmetic."""

    kind: type
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    unit: str = ""

    @property
    def expected(self) -> str:
        noun = ("a whole number" if self.kind is int else "a finite number") + (f" of {self.unit}" if self.unit else "")
        return (f"{noun} {'>' if self.low_open else '>='} {_bound(self.low)} and "
                f"{'<' if self.high_open else '<='} {_bound(self.high)}")

    def read(self, text: str) -> int | float | None:
        """The value ``text`` gives, or None when it is not a number in the range."""
        try:
            value = self.kind(text)
        except (ValueError, OverflowError):
            return None
        if not math.isfinite(value):
            return None
        above = self.low < value if self.low_open else self.low <= value
        below = value < self.high if self.high_open else value <= self.high
        return value if above and below else None


def _bound(bound: float) -> str:
    return f"{int(bound):,}" if float(bound).is_integer() else f"{bound:g}"


class InputError(BatchcheckError):
    """Bad input: malformed file, unknown key, wrong type, inconsistent values. Exit code 2."""

    exit_code = ExitCode.INPUT_ERROR

    def __init__(self, problems: list[Problem] | Problem, source: str | None = None):
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(p.render(self.source) for p in self.problems)


class UsageError(BatchcheckError):
    """A command was called wrongly (missing file, conflicting flags). Exit code 2."""

    exit_code = ExitCode.INPUT_ERROR


class InternalError(BatchcheckError):
    """A bug in batchcheck itself (e.g. an asserted budget broke). Exit code 101; report it."""

    exit_code = ExitCode.INTERNAL_ERROR
