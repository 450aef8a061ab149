"""Every counterexample checked into counterexamples/ still reproduces on the engine."""

from __future__ import annotations

import pytest

from checker.verify.replay import replay_counterexample
from tests.helpers import ROOT

FILES = sorted((ROOT / "counterexamples").glob("*.json"))


def test_there_are_counterexamples_to_replay():
    assert FILES, "counterexamples/ is empty"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_counterexample_still_violates_at_its_recorded_iteration(path):
    report = replay_counterexample(path)
    assert report.violation == report.recorded_violation
