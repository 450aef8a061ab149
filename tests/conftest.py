"""Every test leaves the invariant catalogue as it found it: a user invariant module (``--invariant-module``,
``invariant_modules``) registers its invariants into the one catalogue of the process, and a test that loads one
in-process would otherwise change what later tests see (the documented catalogue, check-log's covered specs)."""

from __future__ import annotations

import os

import pytest

from invariants.catalogue import CATALOGUE

# No progress lines in the tests' captured stderr (a slow machine would add them to messages asserted word for
# word); tests/cli/test_progress_lines.py turns them on.
os.environ.setdefault("BATCHCHECK_PROGRESS", "off")


@pytest.fixture(autouse=True)
def _catalogue_as_found():
    before = dict(CATALOGUE)
    yield
    if CATALOGUE != before:
        CATALOGUE.clear()
        CATALOGUE.update(before)
