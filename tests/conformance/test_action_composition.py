"""The step as action-wise induction decomposes it (checker/verify/actions.py: prefix, each pass's rounds
and hand-overs, completion) equals the engine's step, field by field. A PROVED verdict by action-wise
induction is only as good as this equality."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from checker.smt.conformance import differences, int_outputs, outputs_of_engine
from checker.strategies import SYMBOLIC_MODES, small_scenarios
from checker.verify.actions import composed_step
from tests.helpers import drive


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sc=small_scenarios(modes=SYMBOLIC_MODES))
def test_the_composed_actions_equal_the_engine_step(sc):
    for k, (before, after, d) in enumerate(drive(sc)):
        diff = differences(outputs_of_engine(after, d), int_outputs(sc.policy, before, composed_step))
        assert not diff, f"step {k}: " + "; ".join(diff[:8])
