"""Every counterexample checked into counterexamples/ still reproduces on the engine."""

from __future__ import annotations

import pytest

from checker.api import replay_outcome
from checker.bugreport.document import load_counterexample
from checker.verify.replay import replay_counterexample
from tests.helpers import ROOT

FILES = sorted((ROOT / "counterexamples").glob("*.json"))


def test_there_are_counterexamples_to_replay():
    assert FILES, "counterexamples/ is empty"


def _is_slo(path) -> bool:
    return load_counterexample(path)[0]["property"].get("kind") == "slo"


INVARIANT_FILES = [p for p in FILES if not _is_slo(p)]
SLO_FILES = [p for p in FILES if _is_slo(p)]


@pytest.mark.parametrize("path", INVARIANT_FILES, ids=[p.name for p in INVARIANT_FILES])
def test_counterexample_still_violates_at_its_recorded_iteration(path):
    report = replay_counterexample(path)
    assert report.violation == report.recorded_violation


@pytest.mark.parametrize("path", SLO_FILES, ids=[p.name for p in SLO_FILES])
def test_slo_counterexample_still_violates_its_slo(path):
    """A fuzz find (an SLO over a shrunk trace): the replay on the engine still breaks the SLO."""
    outcome = replay_outcome(path)
    assert outcome.violated, outcome.text
