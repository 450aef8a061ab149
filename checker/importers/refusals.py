"""Every option one import refuses, gathered so that a run reports them all at once (not only the first).

:func:`gathering` opens the collection for one import (``import_policy``); while it is open the parsers
hand an unknown option to :func:`unknown_option` and an importer hands a refusal it can go past to
:func:`refuse_later` instead of raising it. With ``ignore_unknown`` an unknown option becomes an
``ignored:`` line instead. Outside a collection both raise at once, as before. :class:`Refused` is the one
error (exit 2) that lists them, one per line; a single refusal reads exactly as it did on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from checker.errors import BatchcheckError, InputError

IGNORED_UNKNOWN = "unknown to batchcheck, ignored by --ignore-unknown: it may change scheduling"


@dataclass
class Refusals:
    """The refusals of one import, in the order they were found, and the unknown options ignored."""

    ignore_unknown: bool = False
    errors: list[BatchcheckError] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


_CURRENT: ContextVar[Refusals | None] = ContextVar("batchcheck_import_refusals", default=None)


@contextmanager
def gathering(ignore_unknown: bool = False) -> Iterator[Refusals]:
    refusals = Refusals(ignore_unknown)
    token = _CURRENT.set(refusals)
    try:
        yield refusals
    finally:
        _CURRENT.reset(token)


def unknown_option(error: InputError, note: str) -> None:
    """An option the importer does not know (``note``: it as written, ``--flag=value``)."""
    refusals = _CURRENT.get()
    if refusals is None:
        raise error
    if refusals.ignore_unknown:
        refusals.ignored.append(f"{note} ({IGNORED_UNKNOWN})")
    else:
        refusals.errors.append(error)


def refuse_later(error: InputError) -> None:
    """A refusal the import can go past (the option is left out of the policy): reported with the others."""
    refusals = _CURRENT.get()
    if refusals is None:
        raise error
    refusals.errors.append(error)


class Refused(InputError):
    """Several refusals of one import: a count, then each as it reads on its own, indented."""

    def __init__(self, errors: list[BatchcheckError]):
        self.errors = list(errors)
        problems = [p for e in self.errors if isinstance(e, InputError) for p in e.problems]
        super().__init__(problems, None)

    def render(self) -> str:
        texts = [str(e) for e in self.errors]
        if len(texts) == 1:
            return texts[0]
        lines = [line for text in texts for line in text.splitlines()]
        return f"{len(texts)} options cannot be imported:\n" + "\n".join(f"  {line}" for line in lines)


def finish(refusals: Refusals, last: BatchcheckError | None = None) -> None:
    """Raise the gathered refusals (and ``last``, the error that stopped the import) as one error."""
    errors = refusals.errors + ([last] if last is not None else [])
    if not errors:
        return
    if len(errors) == 1 and last is not None:
        raise last
    raise Refused(errors) from None
