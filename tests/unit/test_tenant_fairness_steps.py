"""tenant_fairness step by step (catalogue.TenantFairnessSteps, what check-log evaluates: constant time a step)
gives the verdict of the invariant's own predicate on the whole history (quadratic in the steps) at every step
of engine runs with two tenants, at bounds that hold and bounds that break (issue 23: check-log needed 70-125 s
for 100 steps of tenant_fairness)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from checker.frames import TraceContext, frame_from_engine, params_from_engine
from checker.smt.ops import IntOps
from checker.strategies import small_scenarios
from invariants.catalogue import TenantFairnessSteps, tenant_fairness
from tests.helpers import drive

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
BOUNDS = ({"bound": 0}, {"bound": 40}, {"bound": 400, "w_in": 2, "w_out": 1}, {})
SEEN: set[bool] = set()  # verdicts met (the comparison is only worth something if both occur)


@settings(max_examples=60, **SETTINGS)
@given(sc=small_scenarios(max_requests=7))
def test_the_step_by_step_verdict_is_the_whole_historys(sc):
    frames: list = []
    steps = [TenantFairnessSteps(**params) for params in BOUNDS]
    for k, (_, s, d) in enumerate(drive(sc, max_steps=30)):
        frames.append(frame_from_engine(s, d))
        ctx = TraceContext(sc.policy, params_from_engine(s), frames)
        for params, stepwise in zip(BOUNDS, steps):
            whole = bool(tenant_fairness(IntOps, ctx, k, **params))
            assert stepwise.holds(IntOps, ctx, k) == whole, (k, params)
            SEEN.add(whole)


def test_both_verdicts_were_compared():
    assert SEEN == {True, False}
