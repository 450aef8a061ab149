"""The symbolic step (checker/smt/encode.py) equals the engine's step, field by field.

Two backends of the one encoding are pinned to the engine: IntOps on many generated states, and Z3
(every input pinned, a real solver query, the model read back) on at least 500 generated steps.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from checker.smt.conformance import Z3Step, differences, int_outputs, outputs_of_engine
from checker.strategies import SYMBOLIC_MODES, small_scenarios
from tests.helpers import POLICIES, WORKLOADS, drive

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=250, **SETTINGS)
@given(sc=small_scenarios(modes=SYMBOLIC_MODES))
def test_int_evaluation_of_the_encoding_equals_the_engine_step(sc):
    for k, (before, after, d) in enumerate(drive(sc)):
        diff = differences(outputs_of_engine(after, d), int_outputs(sc.policy, before))
        assert not diff, f"step {k}: " + "; ".join(diff[:8])


def test_z3_evaluation_of_the_encoding_equals_the_engine_step_on_500_cases():
    checked: list[int] = []

    @settings(max_examples=70, **SETTINGS)
    @given(sc=small_scenarios(max_requests=4, modes=SYMBOLIC_MODES))
    def one_scenario(sc):
        z = Z3Step(sc.policy, len(sc.specs), sc.num_tenants)
        n = 0
        for k, (before, after, d) in enumerate(drive(sc, max_steps=14)):
            diff = differences(outputs_of_engine(after, d), z.evaluate(before))
            assert not diff, f"step {k}: " + "; ".join(diff[:8])
            n += 1
        checked.append(n)

    one_scenario()
    assert sum(checked) >= 500, f"only {sum(checked)} steps checked against z3"


@pytest.mark.parametrize("name", sorted(p.name for p in POLICIES.glob("*.yaml")))
def test_every_shipped_policy_is_encoded_and_its_pinned_step_matches(name):
    """Each example policy, on a few steps of the shipped workload: engine step == z3 step."""
    from checker.api import load_policy
    from checker.strategies import Scenario
    from checker.traces import load_requests

    policy = load_policy(POLICIES / name)
    rs = load_requests(workload=WORKLOADS / "chat_mixed.yaml", limit=4)
    specs = rs.specs
    sc = Scenario(policy, specs, len(rs.tenant_names), 200_000)
    z = Z3Step(policy, len(specs), sc.num_tenants)
    steps = 0
    for k, (before, after, d) in enumerate(drive(sc, max_steps=8)):
        assert not differences(outputs_of_engine(after, d), z.evaluate(before)), f"step {k}"
        steps += 1
    assert steps >= 4
