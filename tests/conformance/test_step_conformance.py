"""The symbolic step (checker/smt/encode.py) equals the engine's step, field by field.

Two backends of the one encoding are pinned to the engine: IntOps on many generated states, and Z3
(every input pinned, a real solver query, the model read back) on at least 500 generated steps.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from checker.smt.conformance import Z3Step, differences, int_outputs, outputs_of_engine
from checker.strategies import SYMBOLIC_MODES, small_scenarios
from tests.helpers import drive

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


def test_mixed_phase_mode_is_refused_by_the_encoder_not_mis_encoded():
    from checker.policy import Policy
    from checker.smt.encode import Unsupported, check_supported

    policy = Policy.model_validate({"max_model_len": 64, "kv": {"num_blocks": 8}, "chunking": {"enabled": False},
                                    "batch": {"max_num_seqs": 4, "max_num_batched_tokens": 64, "phase_mode": "mixed"}})
    with pytest.raises(Unsupported, match="phase_mode=mixed"):
        check_supported(policy)
